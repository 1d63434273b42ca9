// Starts the Cosmos DB protocol server the Cosmos store's tests use, on
// 127.0.0.1 over HTTPS with the certificate given (made fresh by the caller;
// the one the package ships expired in 2021), and works around the
// server's known deviations from Cosmos DB:
//  - a point read of a missing item answers 500 instead of 404 unless the
//    request carries `x-ms-documentdb-query-enablecrosspartition: true`:
//    every GET gets that header;
//  - every response closes the connection: keep-alive is turned on.
// Usage: node launch.js PORT CERT.pem KEY.pem PIDFILE
"use strict";
const fs = require("fs");
const { createHttpsServer } = require("@vercel/cosmosdb-server");

const [port, certFile, keyFile, pidFile] = process.argv.slice(2);
if (!port || !certFile || !keyFile || !pidFile) {
  console.error("usage: node launch.js PORT CERT.pem KEY.pem PIDFILE");
  process.exit(2);
}
const server = createHttpsServer({
  cert: fs.readFileSync(certFile),
  key: fs.readFileSync(keyFile),
  keepAlive: true,
});
// Put our fix-ups in front of the package's own request handler.
const handlers = server.listeners("request");
server.removeAllListeners("request");
server.on("request", (req, res) => {
  if (req.method === "GET") {
    req.headers["x-ms-documentdb-query-enablecrosspartition"] = "true";
  }
  for (const h of handlers) h.call(server, req, res);
});
server.on("error", (err) => {
  console.error(`cosmos test server: ${err.message}`);
  process.exit(1);
});
server.listen(Number(port), "127.0.0.1", () => {
  fs.writeFileSync(pidFile, String(process.pid));
  console.log(`cosmos test server on https://127.0.0.1:${port}`);
});
