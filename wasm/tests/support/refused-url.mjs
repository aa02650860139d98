// Prints a loopback URL whose port refused connections a moment ago: bind an
// ephemeral port, note it, close the listener (nothing listens there now,
// so a connection to it is refused).
import { createServer } from 'node:net';

const server = createServer();
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  server.close(() => process.stdout.write(`http://127.0.0.1:${port}\n`));
});
