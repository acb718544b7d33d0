// Peer for bench/http.lua: N chat completions with node's fetch (undici, keep-alive) at a
// given concurrency, JSON encoded and decoded. Prints "wall_seconds cpu_seconds errors".
const [url, conc, n] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
let errors = 0;
async function worker(k, count = n) {
  for (let i = k; i < count; i += conc) {
    const content = `bench ${i}`;
    const r = await fetch(url, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: "bench", messages: [{ role: "user", content }] }),
    });
    const data = await r.json();
    if (data.choices[0].message.content !== "echo:" + content) errors++;
  }
}
// Warm up first (fetch loads undici lazily and the JIT compiles), as clrt's run is warmed.
await Promise.all(Array.from({ length: conc }, (_, k) => worker(k, Math.min(n, 4 * conc + 100))));
errors = 0;
const t0 = performance.now(), c0 = process.cpuUsage();
await Promise.all(Array.from({ length: conc }, (_, k) => worker(k)));
const c = process.cpuUsage(c0);
console.log(`${((performance.now() - t0) / 1000).toFixed(6)} ${((c.user + c.system) / 1e6).toFixed(6)} ${errors}`);
