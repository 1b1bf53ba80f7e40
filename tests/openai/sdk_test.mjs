// Drives a running Estuary router's OpenAI HTTP door with the official `openai` SDK, as a user's
// program would. Every check throws on a mismatch; the process exits 1 naming the check.
//
//   node sdk_test.mjs BASE_URL GOLDEN_JSON MODEL      (BASE_URL like http://127.0.0.1:8000/v1)
//
// The golden ids (greedy, temperature 0, token-id prompts) come back through
// `return_token_ids`, an Estuary extension (as vLLM's). Last, it opens a stream and drops it
// after the first chunk; the C++ side (openai_sdk_test.cc) then checks the pages came back.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const [baseURL, goldenPath, model] = process.argv.slice(2);
const golden = JSON.parse(readFileSync(goldenPath, 'utf8'));
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });

function check(condition, what) {
  if (!condition) throw new Error(what);
}
function same(a, b, what) {
  check(JSON.stringify(a) === JSON.stringify(b), `${what}: ${JSON.stringify(a)} != ${JSON.stringify(b)}`);
}
async function refused(call, status, what) {
  try {
    await call();
  } catch (e) {
    check(e instanceof OpenAI.APIError, `${what}: not an API error: ${e}`);
    same(e.status, status, `${what}: status`);
    return e;
  }
  throw new Error(`${what}: was not refused`);
}
const done = [];
async function step(name, body) {
  await body();
  done.push(name);
  console.log(`ok ${name}`);
}

const models = await client.models.list();
const context = models.data[0].max_model_len;
const fitting = (prompt) => Math.min(golden.max_new_tokens, context - prompt.length);

await step('models', async () => {
  same(models.data.map((m) => m.id), [model], 'served models');
});

await step('golden ids through token-id prompts at temperature 0', async () => {
  for (const c of golden.cases) {
    const r = await client.completions.create({
      model, prompt: c.prompt_ids, max_tokens: fitting(c.prompt_ids), temperature: 0,
      return_token_ids: true,
    });
    same(r.choices[0].token_ids, c.completion_ids, `case "${c.prompt}"`);
    same(r.usage.prompt_tokens, c.prompt_ids.length, 'usage.prompt_tokens');
    same(r.usage.completion_tokens, c.completion_ids.length, 'usage.completion_tokens');
    same(r.usage.total_tokens, c.prompt_ids.length + c.completion_ids.length, 'usage.total_tokens');
    check(r.usage.estuary.mean_backbone_layers > 0, 'usage carries the river figures');
  }
});

const first = golden.cases[0];
const whole = await client.completions.create({
  model, prompt: first.prompt, max_tokens: 60, temperature: 0,
});

await step('a text prompt, streamed, gives the same text, then usage', async () => {
  const stream = await client.completions.create({
    model, prompt: first.prompt, max_tokens: 60, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.text;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  same(text, whole.choices[0].text, 'streamed text');
  same(finish, 'length', 'finish_reason');
  check(usage !== null && usage.completion_tokens === 60, 'the usage chunk');
});

await step('stop strings', async () => {
  const text = whole.choices[0].text;
  const stop = text.slice(20, 24);
  const r = await client.completions.create({
    model, prompt: first.prompt, max_tokens: 60, temperature: 0, stop: [stop],
  });
  same(r.choices[0].text, text.slice(0, text.indexOf(stop)), 'text before the stop string');
  same(r.choices[0].finish_reason, 'stop', 'finish_reason');
});

await step('n = 2, seeded: two choices, the same again with the same seed', async () => {
  const ask = () => client.completions.create({
    model, prompt: first.prompt, max_tokens: 12, temperature: 1, n: 2, seed: 1234,
  });
  const a = await ask(), b = await ask();
  same(a.choices.map((c) => c.index), [0, 1], 'choice indexes');
  same(a.choices.map((c) => c.text), b.choices.map((c) => c.text), 'same seed, same output');
});

await step('unseeded sampling differs between requests', async () => {
  const texts = new Set();
  for (let i = 0; i < 4; ++i) {
    const r = await client.completions.create({ model, prompt: first.prompt, max_tokens: 16 });
    texts.add(r.choices[0].text);
  }
  check(texts.size > 1, `4 unseeded requests at temperature 1 gave one text: ${[...texts]}`);
});

await step('errors: unknown model, wrong types, what is not implemented yet', async () => {
  await refused(() => client.completions.create({ model: 'nope', prompt: 'x' }), 404, 'unknown model');
  const e = await refused(
    () => client.completions.create({ model, prompt: 'x', temperature: 'hot' }), 400, 'temperature');
  same(e.error?.param ?? e.param, 'temperature', 'the error names the field');
  await refused(() => client.completions.create({ model, prompt: 'x', logprobs: 2 }), 400, 'logprobs');
  await refused(() => client.completions.create({ model, prompt: [] }), 400, 'empty prompt');
});

await step('chat on a model without a chat template is refused, saying so', async () => {
  const e = await refused(() => client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Tell me a story' }],
  }), 400, 'chat');
  check(String(e.message).includes('chat template'), `message: ${e.message}`);
});

await step('a stream dropped mid-way', async () => {
  const stream = await client.completions.create({
    model, prompt: first.prompt_ids, max_tokens: 400, temperature: 0, stream: true,
    ignore_eos: true,
  });
  for await (const chunk of stream) {
    if (chunk.choices.length > 0) break;  // leaving the loop aborts the HTTP request
  }
});

console.log(JSON.stringify({ passed: done.length }));
