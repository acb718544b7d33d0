// The page of `clrt view` in headless Chromium (the system's, driven by playwright-core; no
// browser download). Run by tests/lua/test_view.lua with a real run folder behind the URL:
//   CLRT_VIEW_URL=http://127.0.0.1:PORT/ CLRT_CHROMIUM=/usr/bin/chromium CLRT_VIEW_RUNS=2 \
//   CLRT_VIEW_SCREENSHOT=out.png node view_page.mjs
// Exits non-zero, saying which check failed, when the curves, the evaluation, the
// side-by-side runs or a conversation tree with scores and reasons do not appear.
import { chromium } from "playwright-core";

const url = process.env.CLRT_VIEW_URL;
const runs = Number(process.env.CLRT_VIEW_RUNS || 1);
const shot = process.env.CLRT_VIEW_SCREENSHOT;
const browser = await chromium.launch({ executablePath: process.env.CLRT_CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu"] });
let failed = false;
function check(ok, what) {
  console.log((ok ? "ok    " : "FAIL  ") + what);
  if (!ok) failed = true;
}
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const errors = [];
  page.on("pageerror", e => errors.push(String(e)));
  page.on("console", m => { if (m.type() === "error") errors.push(m.text()); });
  await page.goto(url);
  await page.waitForSelector("body[data-ready='1']", { timeout: 20000 });
  check(errors.length === 0, "no script errors" + (errors.length ? ": " + errors.join("; ") : ""));
  check(await page.locator("section.run").count() === runs, `${runs} run(s) side by side`);
  const series = await page.locator("section.run").first().locator("svg.curve").evaluateAll(
    els => els.map(e => e.getAttribute("data-series")));
  check(series.includes("reward") && series.includes("kl") && series.some(s => s.startsWith("metric/")),
    "curves of reward, kl and metric/*: " + series.slice(0, 6).join(", ") + ", ...");
  check(series.some(s => s.startsWith("val/")), "a val/* curve");
  const titles = await page.locator("svg.curve[data-series='reward'] text").allTextContents();
  check(titles.includes("reward"), "the reward curve is labelled");
  check(await page.locator("svg.curve[data-series='reward'] polyline").count() >= 1, "the reward curve has a line");
  check(await page.locator("table.summary tr").count() > 2, "the before/after evaluation table");
  check(await page.locator("section.run .part h3", { hasText: "API bill" }).count() === runs, "an API bill section per run");
  // the tree: prompts -> responses -> futures, with scores and reasons at each level
  const run1 = page.locator("section.run").first();
  check(await run1.locator(".tree details.prompt").count() > 0, "prompts in the rollout tree");
  check(await run1.locator(".tree details.response").count() > 0, "responses under the prompts");
  const resp = run1.locator(".tree details.response:has(details.future)").first();
  check(await resp.count() === 1, "a response with futures");
  if (await resp.count() === 1) {
    await resp.locator(":scope > summary").click();
    const fut = resp.locator("details.future").first();
    await fut.locator(":scope > summary").click();
    check(await resp.locator(":scope > summary .score", { hasText: "reward" }).count() === 1, "the response's reward");
    check(await fut.locator(".score[data-metric='exact_match']").count() >= 1, "the future's exact_match score");
    check(await fut.locator(".why[data-metric='exact_match']").isVisible(), "the metric's reason, visible when open");
    check(await fut.locator(".msg.user .why").count() >= 1, "the simulated user's reason");
    await resp.scrollIntoViewIfNeeded();
  }
  // another sampled step loads on click
  const buttons = run1.locator(".steps button");
  check(await buttons.count() >= 2, "a button per sampled step (first and last at least)");
  if (shot) await page.screenshot({ path: shot, fullPage: false });
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
