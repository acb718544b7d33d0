// A minimal OpenAI-compatible echo server for bench/http.lua: node's http module answers far
// faster than tests/support/fake_openai.py, so the clients, not the server, are measured.
// Binds 127.0.0.1 on an ephemeral port, prints "PORT PID", exits after argv[2] seconds.
import http from "node:http";

const lifetime = Number(process.argv[2] || 300);
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    let content = "";
    try { const body = JSON.parse(Buffer.concat(chunks)); content = body.messages.at(-1).content; } catch { }
    const text = "echo:" + content;
    const out = JSON.stringify({
      id: "chatcmpl-bench", object: "chat.completion", model: "bench",
      choices: [{ index: 0, finish_reason: "stop", message: { role: "assistant", content: text } }],
      usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
    });
    res.writeHead(200, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(out) });
    res.end(out);
  });
});
server.keepAliveTimeout = 60000;
server.listen(0, "127.0.0.1", () => {
  process.stdout.write(`${server.address().port} ${process.pid}\n`);
});
setTimeout(() => process.exit(0), lifetime * 1000).unref();
