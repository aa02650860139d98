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
    (name = "js/workerd.mjs", esModule = embed "../../js/workerd.mjs"),
    (name = "js/core.mjs", esModule = embed "../../js/core.mjs"),
    (name = "pkg/web.js", esModule = embed "../../pkg/web.js"),
    (name = "pkg/recovery_wasm_bg.wasm", wasm = embed "../../pkg/recovery_wasm_bg.wasm"),
  ],
  compatibilityDate = "2025-09-01",
);
