// A fault-injecting HTTPS proxy in front of the Cosmos DB test server
// (launch.js), for the fault tests and the crash torture. It forwards every
// request to the server and, where a rule or the random mode says so,
// misbehaves the way a real account or network does:
//   status        answers STATUS without forwarding (429 carries
//                 x-ms-retry-after-ms: RETRY_AFTER_MS; 503, 408, ...)
//   status-after  forwards, lets the server apply the request, then answers
//                 STATUS instead of the server's answer (an ambiguous write)
//   drop-before   closes the connection once the request arrived, without
//                 forwarding it (nothing applied, no answer)
//   drop-after    forwards, lets the server apply it, then closes the
//                 connection without an answer (an ambiguous write)
//   delay         waits DELAY_MS, then forwards
//   no-session    forwards, but drops x-ms-session-token both ways (the
//                 client loses its session)
//   fake-ack      a lie, for negative controls only (never drawn unless
//                 named): answers a write as if every operation was applied
//                 (a batch: 200 or 201 for each), without forwarding it
// Control (never faulted, not forwarded):
//   POST /__proxy/rules  {"db": NAME, "kind": K, "count": N, "skip": N,
//        "on": "writes"|"reads"|"queries"|"all", "status": S, "retry_after_ms": MS,
//        "delay_ms": MS}
//        appends a rule: after SKIP matching requests to database NAME pass
//        untouched, the next COUNT get fault K. "on" says which requests
//        match: writes to items (the default), reads and queries of items,
//        queries only, or every request. Rules are used in order.
//        {"db": NAME, "clear": true} removes NAME's rules.
//   POST /__proxy/random {"db": NAME, "rate": R, "seed": S, "kinds": [K...]}:
//        each request to items (/docs) of database NAME (of any, without
//        "db") gets a fault with probability R, its kind drawn from KINDS
//        (default: all). rate 0 turns it off.
//   GET  /__proxy/log?db=NAME  the requests to NAME seen (time in ms, method,
//        path, whether a write, fault), the last 2,000
//   GET  /__proxy/stats  faults injected, by kind
//   GET  /__proxy/faults?db=NAME  faults that failed or left open a write
//        to NAME (every kind but 429s, which are sent again, delays, lost
//        session tokens and the lie; and 502s for a server that did not
//        answer the proxy), by partition key
//        (a run's), counted for as long as the proxy runs
// Usage: node faultproxy.js PORT UPSTREAM_PORT CERT.pem KEY.pem PIDFILE
"use strict";
const fs = require("fs");
const https = require("https");

const [port, upstreamPort, certFile, keyFile, pidFile] = process.argv.slice(2);
if (!port || !upstreamPort || !certFile || !keyFile || !pidFile) {
  console.error("usage: node faultproxy.js PORT UPSTREAM_PORT CERT.pem KEY.pem PIDFILE");
  process.exit(2);
}
const cert = fs.readFileSync(certFile);
const upstream = new https.Agent({ keepAlive: true, ca: cert, maxSockets: 64 });
// The honest faults, drawn at random by default; and the lie.
const KINDS = ["status", "status-after", "drop-before", "drop-after", "delay", "no-session"];
const ALL_KINDS = KINDS.concat(["fake-ack"]);

let rules = [];
// Random faults by database ("" for any), each with its own seeded stream.
const randoms = new Map();
const stats = {};
const logs = new Map();
const writeFaults = new Map();

// xorshift64, seeded: the same seed draws the same faults for the same
// order of requests (concurrent clients may arrive in another order).
function next(random) {
  let x = random.state;
  x ^= x << 13n;
  x &= 0xffffffffffffffffn;
  x ^= x >> 7n;
  x ^= x << 17n;
  x &= 0xffffffffffffffffn;
  random.state = x;
  return Number(x >> 11n) / 2 ** 53;
}

function dbOf(url) {
  const m = /^\/dbs\/([^/?]+)/.exec(url);
  try {
    return m ? decodeURIComponent(m[1]) : "";
  } catch (e) {
    return m[1];
  }
}

function isItems(req) {
  return /\/docs/.test(req.url);
}

function isQuery(req) {
  return req.method === "POST" && isItems(req) && !!req.headers["x-ms-documentdb-isquery"];
}

function isWrite(req) {
  return (
    ["POST", "PUT", "DELETE", "PATCH"].includes(req.method) &&
    /\/docs/.test(req.url) &&
    !req.headers["x-ms-documentdb-isquery"]
  );
}

// The fault for this request, if any.
function faultFor(req) {
  const db = dbOf(req.url);
  const matches = (r) =>
    r.count > 0 &&
    r.db === db &&
    (r.on === "all" ||
      (r.on === "reads" && isItems(req) && !isWrite(req)) ||
      (r.on === "queries" && isQuery(req)) ||
      (r.on === "writes" && isWrite(req)));
  const i = rules.findIndex(matches);
  if (i >= 0) {
    const rule = rules[i];
    if (rule.skip > 0) {
      rule.skip -= 1;
      return null;
    }
    rule.count -= 1;
    if (rule.count === 0) rules.splice(i, 1);
    return rule;
  }
  const random = randoms.get(db) || randoms.get("");
  if (random && random.rate > 0 && isItems(req) && next(random) < random.rate) {
    const kind = random.kinds[Math.floor(next(random) * random.kinds.length)];
    // The lie is about writes: a read is never answered with made-up items.
    if (kind === "fake-ack" && !isWrite(req)) return null;
    const statuses = [429, 429, 503, 408];
    return {
      kind,
      status: statuses[Math.floor(next(random) * statuses.length)],
      retry_after_ms: 5 + Math.floor(next(random) * 60),
      delay_ms: 20 + Math.floor(next(random) * 400),
    };
  }
  return null;
}

// A write a fault failed or left open, by database and partition key.
function countWriteFault(req) {
  const db = dbOf(req.url);
  const pk = req.headers["x-ms-documentdb-partitionkey"] || "";
  if (!writeFaults.has(db)) writeFaults.set(db, {});
  const byPk = writeFaults.get(db);
  byPk[pk] = (byPk[pk] || 0) + 1;
}

function remember(req, fault) {
  const db = dbOf(req.url);
  if (!db) return;
  let log = logs.get(db);
  if (!log) logs.set(db, (log = []));
  log.push({ t: Date.now(), method: req.method, path: req.url, write: isWrite(req), fault: fault ? fault.kind : null });
  if (log.length > 2000) log.shift();
  if (logs.size > 1000) logs.delete(logs.keys().next().value);
}

function answer(res, status, extra) {
  res.statusCode = status;
  res.setHeader("content-type", "application/json");
  for (const [k, v] of Object.entries(extra || {})) res.setHeader(k, v);
  res.end(JSON.stringify({ code: "InjectedByProxy", message: `fault injected by the proxy (HTTP ${status})` }));
}

// An answer that says a write was applied, for a write that was not.
function fakeAck(req, res, body) {
  let ops = null;
  try {
    ops = JSON.parse(body.toString() || "null");
  } catch (e) {
    ops = null;
  }
  res.setHeader("content-type", "application/json");
  if (req.headers["x-ms-cosmos-is-batch-request"] && Array.isArray(ops)) {
    res.statusCode = 200;
    return res.end(
      JSON.stringify(ops.map((op) => ({ statusCode: op && op.operationType === "Create" ? 201 : 200 }))),
    );
  }
  res.statusCode = req.method === "POST" ? 201 : 200;
  const doc = ops && typeof ops === "object" && !Array.isArray(ops) ? ops : {};
  res.end(JSON.stringify(Object.assign({}, doc, { _etag: `"fake-${Date.now()}"`, _ts: Math.floor(Date.now() / 1000) })));
}

function control(req, res, body) {
  const [path, query] = req.url.split("?");
  const json = (status, value) => {
    res.statusCode = status;
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify(value));
  };
  try {
    if (path === "/__proxy/rules" && req.method === "POST") {
      const r = JSON.parse(body || "{}");
      if (r.clear) rules = rules.filter((x) => x.db !== (r.db || ""));
      else {
        if (!ALL_KINDS.includes(r.kind)) return json(400, { error: `unknown kind ${r.kind}` });
        if (!["writes", "reads", "queries", "all", undefined].includes(r.on)) return json(400, { error: `unknown "on" ${r.on}` });
        const rule = Object.assign({ count: 1, skip: 0, on: "writes", status: 503, retry_after_ms: 20, delay_ms: 100 }, r);
        rule.status = Number(rule.status);
        if (typeof rule.db !== "string" || rule.db === "") return json(400, { error: "a rule names its database" });
        if (!Number.isInteger(rule.status) || rule.status < 200 || rule.status > 599) return json(400, { error: "status is 200 to 599" });
        rules.push(rule);
      }
      return json(200, { rules: rules.filter((x) => x.db === (r.db || "")) });
    }
    if (path === "/__proxy/random" && req.method === "POST") {
      const r = JSON.parse(body || "{}");
      const kinds = r.kinds && r.kinds.length ? r.kinds : KINDS;
      if (kinds.some((k) => !ALL_KINDS.includes(k))) return json(400, { error: "unknown kind" });
      const seed = BigInt.asUintN(64, BigInt(r.seed || 1)) || 1n;
      randoms.set(r.db || "", { rate: Number(r.rate) || 0, kinds, state: seed });
      return json(200, { rate: Number(r.rate) || 0, kinds });
    }
    if (path === "/__proxy/log" && req.method === "GET") {
      const db = new URLSearchParams(query || "").get("db") || "";
      return json(200, logs.get(db) || []);
    }
    if (path === "/__proxy/stats" && req.method === "GET") return json(200, stats);
    if (path === "/__proxy/faults" && req.method === "GET") {
      const db = new URLSearchParams(query || "").get("db") || "";
      return json(200, writeFaults.get(db) || {});
    }
  } catch (e) {
    return json(400, { error: String(e) });
  }
  return json(404, { error: "no such control endpoint" });
}

function forward(req, body, dropSession, done) {
  const headers = Object.assign({}, req.headers);
  headers.host = `127.0.0.1:${upstreamPort}`;
  if (dropSession) delete headers["x-ms-session-token"];
  const up = https.request(
    { host: "127.0.0.1", port: Number(upstreamPort), method: req.method, path: req.url, headers, agent: upstream },
    (ur) => {
      const chunks = [];
      ur.on("data", (c) => chunks.push(c));
      ur.on("end", () => done(null, ur, Buffer.concat(chunks)));
      ur.on("error", (e) => done(e));
    },
  );
  up.on("error", (e) => done(e));
  up.end(body);
}

const server = https.createServer({ cert, key: fs.readFileSync(keyFile), keepAlive: true }, (req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    try {
      handle(req, res, Buffer.concat(chunks));
    } catch (e) {
      console.error(`cosmos fault proxy: ${e.stack || e}`);
      if (!res.headersSent) answer(res, 500);
    }
  });
});

function handle(req, res, body) {
  if (req.url.startsWith("/__proxy/")) return control(req, res, body.toString());
  const fault = faultFor(req);
  remember(req, fault);
  if (fault) stats[fault.kind] = (stats[fault.kind] || 0) + 1;
  const throttled = fault && fault.kind === "status" && Number(fault.status) === 429;
  if (fault && isWrite(req) && !throttled && !["delay", "no-session", "fake-ack"].includes(fault.kind)) {
    countWriteFault(req);
  }
  const kind = fault ? fault.kind : null;
  if (kind === "status") {
    const extra = Number(fault.status) === 429 ? { "x-ms-retry-after-ms": String(fault.retry_after_ms) } : {};
    return answer(res, fault.status, extra);
  }
  if (kind === "drop-before") return req.socket.destroy();
  if (kind === "fake-ack" && isWrite(req)) return fakeAck(req, res, body);
  const go = () =>
    forward(req, body, kind === "no-session", (err, ur, data) => {
      if (err) {
        // The server's answer was lost on the way: as open as a drop.
        if (isWrite(req)) countWriteFault(req);
        return answer(res, 502);
      }
      if (kind === "drop-after") return req.socket.destroy();
      if (kind === "status-after") return answer(res, Number(fault.status) === 429 ? 503 : fault.status);
      res.statusCode = ur.statusCode;
      for (const [k, v] of Object.entries(ur.headers)) {
        if (["connection", "keep-alive", "transfer-encoding", "content-length"].includes(k)) continue;
        if (kind === "no-session" && k === "x-ms-session-token") continue;
        res.setHeader(k, v);
      }
      res.end(data);
    });
  if (kind === "delay") setTimeout(go, fault.delay_ms);
  else go();
}
server.on("error", (err) => {
  console.error(`cosmos fault proxy: ${err.message}`);
  process.exit(1);
});
server.listen(Number(port), "127.0.0.1", () => {
  fs.writeFileSync(pidFile, String(process.pid));
  console.log(`cosmos fault proxy on https://127.0.0.1:${port} -> ${upstreamPort}`);
});
// A bug in a callback must not take the proxy (and every test through it)
// down: say so and go on.
process.on("uncaughtException", (e) => console.error(`cosmos fault proxy: ${e.stack || e}`));
