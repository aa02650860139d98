using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "main", worker = .testWorker),
    (name = "internet", network = (allow = ["local"])),
  ],
  sockets = [ (name = "http", address = "127.0.0.1:0", http = (), service = "main") ],
);

const testWorker :Workerd.Worker = (
  modules = [
    (name = "worker.mjs", esModule = embed "worker.mjs"),
    (name = "pkg/shell.mjs", esModule = embed "../../pkg/shell.mjs"),
    (name = "pkg/all/workerd.mjs", esModule = embed "../../pkg/all/workerd.mjs"),
    (name = "pkg/all/glue.web.js", esModule = embed "../../pkg/all/glue.web.js"),
    (name = "pkg/all/recovery_wasm_bg.wasm", wasm = embed "../../pkg/all/recovery_wasm_bg.wasm"),
  ],
  compatibilityDate = "2025-09-01",
);
