// Starts the Cosmos DB protocol server the Cosmos store's tests use, on
// 127.0.0.1 over HTTPS with the certificate given (made fresh by the caller;
// the one the package ships expired in 2021), and works around the
// server's known deviations from Cosmos DB:
//  - a point read of a missing item answers 500 instead of 404 unless the
//    request carries `x-ms-documentdb-query-enablecrosspartition: true`:
//    every GET gets that header;
//  - every response closes the connection: keep-alive is turned on.
// For the fault tests it also takes `POST /__steadfast/faults` with
// {"db": NAME, "status": 429|503, "count": N, "applied": true|false}: the
// next N writes to items of database NAME (POST, PUT, DELETE; not queries)
// answer that status, before they are applied or (applied: true) after
// they were: an ambiguous outcome. Other databases (other tests) are not
// touched. `GET /__steadfast/faults` shows how many are left.
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
let faults = { db: "", status: 0, count: 0, applied: false };
const handlers = server.listeners("request");
server.removeAllListeners("request");
server.on("request", (req, res) => {
  if (req.url === "/__steadfast/faults" && req.method === "GET") {
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify(faults));
    return;
  }
  if (req.url === "/__steadfast/faults" && req.method === "POST") {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      try {
        faults = Object.assign({ db: "", status: 0, count: 0, applied: false }, JSON.parse(body));
        res.statusCode = 204;
      } catch (e) {
        res.statusCode = 400;
      }
      res.end();
    });
    return;
  }
  if (req.method === "GET") {
    req.headers["x-ms-documentdb-query-enablecrosspartition"] = "true";
  }
  const isWrite =
    ["POST", "PUT", "DELETE"].includes(req.method) &&
    /\/docs/.test(req.url) &&
    faults.db !== "" &&
    req.url.startsWith(`/dbs/${faults.db}/`) &&
    !req.headers["x-ms-documentdb-isquery"];
  if (isWrite && faults.count > 0) {
    faults.count -= 1;
    if (!faults.applied) {
      res.statusCode = faults.status;
      res.setHeader("content-type", "application/json");
      if (faults.status === 429) res.setHeader("x-ms-retry-after-ms", "20");
      res.end(JSON.stringify({ code: "Injected", message: "fault injected by the test" }));
      req.resume();
      return;
    }
    const end = res.end.bind(res);
    res.end = () => {
      res.statusCode = faults.status || 503;
      end(JSON.stringify({ code: "Injected", message: "fault injected after the write" }));
    };
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
