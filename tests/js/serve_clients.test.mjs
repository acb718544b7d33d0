// serve_clients.test.mjs — `clrt serve` driven by the clients people use (node:test). Started
// by tests/lua/test_serve_clients.lua with CLRT_BASE_URL, CLRT_API_KEY and CLRT_MODEL set;
// the model is a tiny random one, so replies are gibberish: what is checked is the protocol
// (shapes the SDKs validate, streaming, structured output that parses, typed errors).
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI, { AuthenticationError, NotFoundError, BadRequestError } from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText, generateObject } from "ai";
import { ChatOpenAI } from "@langchain/openai";
import { z } from "zod";

const baseURL = process.env.CLRT_BASE_URL;
const apiKey = process.env.CLRT_API_KEY;
const model = process.env.CLRT_MODEL;
assert.ok(baseURL && apiKey && model, "CLRT_BASE_URL, CLRT_API_KEY and CLRT_MODEL must be set");

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const messages = [
  { role: "developer", content: "be brief" },
  { role: "user", content: "hello, what is your city?" },
];
// small JSON values: a random model fills strings until a length cap
const Answer = z.object({ city: z.string().max(12), ask: z.boolean() });

test("openai: chat.completions.create returns the full typed shape", async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.equal(r.model, model);
  const c = r.choices[0];
  assert.equal(typeof c.message.content, "string");
  assert.equal(c.message.refusal, null);
  assert.equal(c.logprobs, null);
  assert.ok(["stop", "length"].includes(c.finish_reason));
  assert.ok(r.usage.completion_tokens >= 1);
  // OpenAI's prompt caching field: prompt tokens served from the server's prefix cache
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, "number");
  assert.ok(r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens);
});

test("openai: the stream helper's finalChatCompletion equals the non-streamed reply (same seed)", async () => {
  const body = { model, messages, max_tokens: 20, temperature: 1, seed: 11, stop: ["e "] };
  const plain = await client.chat.completions.create(body);
  const final = await client.chat.completions.stream(body).finalChatCompletion();
  assert.equal(final.choices[0].message.content, plain.choices[0].message.content);
  assert.equal(final.choices[0].finish_reason, plain.choices[0].finish_reason);
  // a plain chunk loop: choices[0] on every chunk, usage only in the last one when asked
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = "", usage = null;
  for await (const chunk of stream) {
    assert.ok(Array.isArray(chunk.choices));
    if (chunk.choices[0]?.delta?.content) text += chunk.choices[0].delta.content;
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
});

test("openai: logprobs with top_logprobs", async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = r.choices[0].logprobs.content;
  assert.ok(content.length >= 1);
  for (const e of content) {
    assert.equal(typeof e.token, "string");
    assert.ok(e.logprob <= 0 && Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 2);
    assert.equal(e.top_logprobs[0].token, e.token);   // greedy
  }
  assert.equal(content.map((e) => e.token).join(""), r.choices[0].message.content);
});

test("openai: chat.completions.parse with zodResponseFormat", async () => {
  const r = await client.chat.completions.parse({ model, messages, max_tokens: 120, temperature: 1, seed: 3,
    response_format: zodResponseFormat(Answer, "answer") });
  const parsed = r.choices[0].message.parsed;
  assert.equal(typeof parsed.city, "string");
  assert.equal(typeof parsed.ask, "boolean");
});

test("openai: zodResponseFormat with an integer field (integer bounds of +-2^53)", async () => {
  const r = await client.chat.completions.parse({ model, messages, max_tokens: 120, temperature: 1, seed: 4,
    response_format: zodResponseFormat(z.object({ n: z.number().int(), ask: z.boolean() }), "count") });
  assert.ok(Number.isInteger(r.choices[0].message.parsed.n));
});

const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather in a city",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 }, days: { type: "integer", minimum: 1, maximum: 7 } },
      required: ["city", "days"], additionalProperties: false } } },
  { type: "function", function: { name: "ping", parameters: { type: "object", properties: {} } } },
];

test("openai: tools — a named or required call is decoded under its schema; history renders back", async () => {
  const named = await client.chat.completions.create({ model, messages, tools, max_tokens: 150, temperature: 1, seed: 2,
    tool_choice: { type: "function", function: { name: "get_weather" } } });
  const c = named.choices[0];
  assert.equal(c.finish_reason, "tool_calls");
  assert.equal(c.message.content, null);
  const call = c.message.tool_calls[0];
  assert.equal(call.type, "function");
  assert.equal(call.function.name, "get_weather");
  assert.equal(typeof call.id, "string");
  const args = JSON.parse(call.function.arguments);
  assert.equal(typeof args.city, "string");
  assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7);
  const required = await client.chat.completions.create({ model, messages, tools: tools.slice(0, 1), max_tokens: 150,
    temperature: 1, seed: 3, tool_choice: "required" });
  assert.equal(required.choices[0].message.tool_calls[0].function.name, "get_weather");
  // streamed: the stream helper assembles the same call
  const final = await client.chat.completions.stream({ model, messages, tools, max_tokens: 150, temperature: 1, seed: 2,
    tool_choice: { type: "function", function: { name: "get_weather" } } }).finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, "tool_calls");
  assert.deepEqual(final.choices[0].message.tool_calls[0].function, call.function);
  // the call and its result go back in the history
  const next = await client.chat.completions.create({ model, tools, max_tokens: 8, temperature: 0, messages: [
    ...messages, c.message, { role: "tool", tool_call_id: call.id, content: '{"temp": 21}' }] });
  assert.ok(["stop", "length", "tool_calls"].includes(next.choices[0].finish_reason));
});

test("openai: models.retrieve and models.list", async () => {
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  const list = await client.models.list();
  assert.deepEqual(list.data.map((x) => x.id), [model]);
});

test("openai: errors are the SDK's typed exceptions", async () => {
  const bad = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model, messages }), AuthenticationError);
  await assert.rejects(client.chat.completions.create({ model: "no-such-model", messages }), (e) =>
    e instanceof NotFoundError && e.code === "model_not_found" && e.param === "model");
  await assert.rejects(client.models.retrieve("no-such-model"), NotFoundError);
  await assert.rejects(client.chat.completions.create({ model, messages, temperature: 5 }), (e) =>
    e instanceof BadRequestError && e.param === "temperature" && typeof e.code === "string");
});

test("openai: logit_bias +100 forces a token, streamed and not, on chat and legacy completions", async () => {
  // the same token over and over: every logprobs entry names it, and another id gives other text
  const forced = async (id, extra = {}) => client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 1, seed: 5,
    logprobs: true, logit_bias: { [id]: 100 }, ...extra });
  const a = await forced(40);
  const tokens = a.choices[0].logprobs.content.map((e) => e.token);
  assert.equal(tokens.length, 8);
  assert.ok(tokens.every((t) => t === tokens[0]), `one token repeated: ${JSON.stringify(tokens)}`);
  assert.equal(a.choices[0].message.content, tokens[0].repeat(8));
  const b = await forced(41);
  assert.notEqual(b.choices[0].message.content, a.choices[0].message.content);
  let streamed = "";
  for await (const chunk of await forced(40, { stream: true })) streamed += chunk.choices[0]?.delta?.content ?? "";
  assert.equal(streamed, a.choices[0].message.content);
  const c = await client.completions.create({ model, prompt: "plan a trip", max_tokens: 8, logit_bias: { 40: 100 } });
  assert.equal(c.object, "text_completion");
  assert.equal(c.choices[0].text, a.choices[0].message.content);
  let cs = "";
  for await (const chunk of await client.completions.create({ model, prompt: "plan a trip", max_tokens: 8, logit_bias: { 40: 100 }, stream: true })) {
    cs += chunk.choices[0]?.text ?? "";
  }
  assert.equal(cs, c.choices[0].text);
});

test("openai: a parameter the server does not take, or out of range, is a BadRequestError naming it", async () => {
  for (const [extra, param] of [[{ logit_bias: { abc: 1 } }, "logit_bias"], [{ logit_bias: { 5: 200 } }, "logit_bias"],
    [{ frequency_penalty: 3 }, "frequency_penalty"], [{ presence_penalty: -2.5 }, "presence_penalty"], [{ top_k: 5 }, "top_k"]]) {
    await assert.rejects(client.chat.completions.create({ model, messages, max_tokens: 2, ...extra }), (e) =>
      e instanceof BadRequestError && e.param === param && e.message.includes(param) && !e.message.includes(".lua"));
  }
  await assert.rejects(client.completions.create({ model, prompt: "hi", echo: true }), (e) =>
    e instanceof BadRequestError && e.param === "echo");
  await assert.rejects(client.chat.completions.create({ model, messages: [{ role: "user", content: "caf\udce9" }] }), (e) =>
    e instanceof BadRequestError && !e.message.includes(".lua"));
});

// the AI SDK takes the system prompt apart (the server takes "developer" as "system")
const plainMessages = [messages[1]];
const provider = createOpenAICompatible({ name: "clrt", baseURL, apiKey, supportsStructuredOutputs: true, includeUsage: true });

test("AI SDK: generateText and streamText (same seed, same text, usage kept)", async () => {
  const opts = { model: provider(model), system: "be brief", messages: plainMessages, maxOutputTokens: 16, temperature: 1, seed: 21, maxRetries: 0 };
  const g = await generateText(opts);
  assert.equal(typeof g.text, "string");
  assert.ok(g.usage.outputTokens >= 1);
  const s = streamText(opts);
  assert.equal(await s.text, g.text);
  const usage = await s.usage;
  assert.equal(usage.outputTokens, g.usage.outputTokens);
  // the same prompt again: the AI SDK reads prompt_tokens_details.cached_tokens as cached input
  if (process.env.CLRT_PREFIX_CACHE === "1") assert.ok(usage.cachedInputTokens > 0, `cachedInputTokens ${usage.cachedInputTokens}`);
  assert.equal(await s.finishReason, g.finishReason);
});

test("AI SDK: generateObject", async () => {
  const r = await generateObject({ model: provider(model), schema: Answer, system: "be brief", messages: plainMessages, maxOutputTokens: 120, temperature: 1, seed: 5, maxRetries: 0 });
  assert.equal(typeof r.object.city, "string");
  assert.equal(typeof r.object.ask, "boolean");
});

const chat = new ChatOpenAI({ model, apiKey, configuration: { baseURL }, maxTokens: 16, temperature: 0, maxRetries: 0 });

test("LangChain: invoke and stream agree", async () => {
  const m = await chat.invoke(messages.map((x) => [x.role === "developer" ? "system" : "human", x.content]));
  assert.equal(typeof m.content, "string");
  let text = "";
  for await (const chunk of await chat.stream(messages.map((x) => [x.role === "developer" ? "system" : "human", x.content]))) {
    text += chunk.content;
  }
  assert.equal(text, m.content);
});

test("LangChain: withStructuredOutput", async () => {
  const structured = new ChatOpenAI({ model, apiKey, configuration: { baseURL }, maxTokens: 120, temperature: 1, maxRetries: 0 })
    .withStructuredOutput(Answer, { method: "jsonSchema" });
  const r = await structured.invoke("what is your city?");
  assert.equal(typeof r.city, "string");
  assert.equal(typeof r.ask, "boolean");
});
