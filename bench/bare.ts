// bench/bare.ts: the baseline, a bare node:http server that reads the whole body and answers 200. The
// benchmarks run it as a child process on the same Node as the receiver and divide by its rate.
//   npx tsx bench/bare.ts [--port 0]

import { createServer } from "node:http";

const portArg = process.argv.indexOf("--port");
const port = portArg > 0 ? Number(process.argv[portArg + 1]) : 0;
const server = createServer((req, res) => {
  req.on("data", () => {});
  req.on("end", () => {
    res.writeHead(200, { "content-type": "text/plain; charset=utf-8", "content-length": 6 });
    res.end("stored");
  });
});
server.listen(port, "127.0.0.1", () => {
  const address = server.address();
  console.log(`Listening on http://127.0.0.1:${typeof address === "object" && address ? address.port : port}`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
