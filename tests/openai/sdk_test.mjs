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

// `node sdk_test.mjs BASE_URL GOLDEN_JSON MODEL chat`: the router was started with
// --chat-template; only chatChecks (at the end of this file) run.
if (process.argv[5] === 'chat') {
  await chatChecks();
  console.log(JSON.stringify({ passed: done.length }));
  process.exit(0);
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
  const included = await client.completions.create({
    model, prompt: first.prompt, max_tokens: 60, temperature: 0, stop: [stop],
    include_stop_str_in_output: true,
  });
  same(included.choices[0].text, text.slice(0, text.indexOf(stop) + stop.length),
       'include_stop_str_in_output: the text ends with the stop string');
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

await step('logprobs: one entry per token, the chosen token most likely at temperature 0', async () => {
  const check_entries = (lp, n) => {
    same(lp.tokens.length, n, 'a token per generated token');
    same(lp.token_logprobs.length, n, 'a log-probability per token');
    for (let i = 0; i < n; ++i) {
      const top = Object.entries(lp.top_logprobs[i]);
      check(top.length >= 1 && top.length <= 3, `top_logprobs[${i}] has ${top.length} entries`);
      const best = Math.max(...top.map(([, v]) => v));
      check(Math.abs(best - lp.token_logprobs[i]) < 1e-5, `token ${i} is the most likely one`);
      check(lp.token_logprobs[i] <= 0, 'log-probabilities are <= 0');
    }
    for (let i = 1; i < n; ++i) check(lp.text_offset[i] >= lp.text_offset[i - 1], 'offsets grow');
  };
  const r = await client.completions.create({
    model, prompt: first.prompt_ids, max_tokens: 12, temperature: 0, logprobs: 3,
    return_token_ids: true,
  });
  same(r.choices[0].token_ids, first.completion_ids.slice(0, 12), 'the greedy ids');
  check_entries(r.choices[0].logprobs, 12);
  const stream = await client.completions.create({
    model, prompt: first.prompt_ids, max_tokens: 12, temperature: 0, logprobs: 3, stream: true,
  });
  const streamed = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      if (!choice.logprobs) continue;
      for (const key of Object.keys(streamed)) streamed[key].push(...choice.logprobs[key]);
    }
  }
  check_entries(streamed, 12);
  same(streamed.token_logprobs, r.choices[0].logprobs.token_logprobs, 'streamed = whole');
});

await step('echo, penalties, logit_bias, min_tokens', async () => {
  const echoed = await client.completions.create({
    model, prompt: first.prompt, max_tokens: 8, temperature: 0, echo: true,
  });
  const plain = await client.completions.create({
    model, prompt: first.prompt, max_tokens: 8, temperature: 0,
  });
  same(echoed.choices[0].text, first.prompt + plain.choices[0].text, 'echo prepends the prompt');
  const penalised = await client.completions.create({
    model, prompt: first.prompt_ids, max_tokens: 40, temperature: 0, frequency_penalty: 2,
    presence_penalty: 1, return_token_ids: true,
  });
  const greedy = first.completion_ids.slice(0, 40);
  check(JSON.stringify(penalised.choices[0].token_ids) !== JSON.stringify(greedy),
        'the penalties changed the output');
  const banned = first.completion_ids[0];
  const biased = await client.completions.create({
    model, prompt: first.prompt_ids, max_tokens: 4, temperature: 0,
    logit_bias: { [banned]: -100 }, return_token_ids: true,
  });
  check(biased.choices[0].token_ids[0] !== banned, 'logit_bias -100 bans the token');
  const e = await refused(() => client.completions.create({
    model, prompt: 'x', max_tokens: 4, min_tokens: 5,
  }), 400, 'min_tokens > max_tokens');
  check(String(e.message).includes('min_tokens'), `message: ${e.message}`);
});

await step('errors: unknown model, wrong types, what is not implemented yet', async () => {
  await refused(() => client.completions.create({ model: 'nope', prompt: 'x' }), 404, 'unknown model');
  const e = await refused(
    () => client.completions.create({ model, prompt: 'x', temperature: 'hot' }), 400, 'temperature');
  same(e.error?.param ?? e.param, 'temperature', 'the error names the field');
  await refused(() => client.completions.create({ model, prompt: 'x', logprobs: 21 }), 400, 'logprobs');
  await refused(() => client.completions.create({ model, prompt: 'x', best_of: 3 }), 400, 'best_of');
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

// /v1/chat/completions through a chat template (the router has --chat-template; see the
// 'chat' mode above): the prompt is the rendered template, counted as /tokenize counts it.
async function chatChecks() {
  const messages = [
    { role: 'system', content: 'You tell short stories.' },
    { role: 'user', content: 'Tell me a story about a cat.' },
  ];
  const tokenized = await fetch(new URL('/tokenize', baseURL), {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, messages }),
  }).then((r) => r.json());
  check(tokenized.count > 10, `/tokenize with messages: ${JSON.stringify(tokenized)}`);
  let whole;
  await step('chat, not streamed: an assistant message, finish_reason, usage of the rendered prompt', async () => {
    whole = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
    same(whole.object, 'chat.completion', 'object');
    const choice = whole.choices[0];
    same(choice.message.role, 'assistant', 'role');
    check(typeof choice.message.content === 'string' && choice.message.content.length > 0,
          `content: ${JSON.stringify(choice.message.content)}`);
    check(['stop', 'length'].includes(choice.finish_reason), `finish_reason: ${choice.finish_reason}`);
    same(whole.usage.prompt_tokens, tokenized.count, 'usage.prompt_tokens = /tokenize count');
    check(whole.usage.completion_tokens > 0 && whole.usage.completion_tokens <= 12, 'usage.completion_tokens');
  });
  await step('chat, streamed: role first, the same text at temperature 0, finish_reason, usage', async () => {
    const stream = await client.chat.completions.create({
      model, messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    let text = '', first = true, finish = null, usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      if (chunk.choices.length === 0) continue;
      const choice = chunk.choices[0];
      if (first) same(choice.delta.role, 'assistant', 'the first chunk carries the role');
      first = false;
      text += choice.delta.content ?? '';
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    same(text, whole.choices[0].message.content, 'streamed text');
    same(finish, whole.choices[0].finish_reason, 'finish_reason');
    check(usage !== null, 'a usage chunk');
    same(usage.prompt_tokens, tokenized.count, 'streamed usage.prompt_tokens');
  });
  await step('chat: bad messages are 400s naming the field', async () => {
    const e = await refused(() => client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'a' }, { role: 'robot', content: 'b' }],
    }), 400, 'role');
    same(e.error?.param ?? e.param, 'messages[1].role', 'the error names the field');
    await refused(() => client.chat.completions.create({
      model, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }],
    }), 400, 'image part');
  });
}
