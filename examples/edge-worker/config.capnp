# workerd config for the edge-worker example (see README.md).
#
#   wasm/node_modules/.bin/workerd serve examples/edge-worker/config.capnp \
#     --external-addr upstream=127.0.0.1:8080
#
# The socket listens on 127.0.0.1:8787 (`--socket-addr http=…` to move it);
# the upstream is the external service `upstream` (`--external-addr` to
# point it elsewhere); the key comes from the UPSTREAM_API_KEY environment
# variable of the workerd process.
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "proxy", worker = .proxyWorker),
    (name = "upstream", external = (address = "127.0.0.1:8080", http = ())),
  ],
  sockets = [ (name = "http", address = "127.0.0.1:8787", http = (), service = "proxy") ],
);

const proxyWorker :Workerd.Worker = (
  modules = [
    (name = "worker.mjs", esModule = embed "worker.mjs"),
    # The npm package as wrangler would bundle it: the `workerd` entry, its
    # glue, and the .wasm as a compiled module (never compiled from bytes).
    (name = "recovery-wasm", esModule = "export * from './node_modules/recovery-wasm/pkg/all/workerd.mjs';"),
    (name = "node_modules/recovery-wasm/pkg/all/workerd.mjs", esModule = embed "../../wasm/pkg/all/workerd.mjs"),
    (name = "node_modules/recovery-wasm/pkg/shell.mjs", esModule = embed "../../wasm/pkg/shell.mjs"),
    (name = "node_modules/recovery-wasm/pkg/all/glue.web.js", esModule = embed "../../wasm/pkg/all/glue.web.js"),
    (name = "node_modules/recovery-wasm/pkg/all/recovery_wasm_bg.wasm", wasm = embed "../../wasm/pkg/all/recovery_wasm_bg.wasm"),
  ],
  compatibilityDate = "2025-09-01",
  bindings = [
    (name = "UPSTREAM_URL", text = "http://upstream.internal"),
    (name = "UPSTREAM", service = "upstream"),
    (name = "UPSTREAM_API_KEY", fromEnvironment = "UPSTREAM_API_KEY"),
  ],
);
