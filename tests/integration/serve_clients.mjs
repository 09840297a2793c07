// Real OpenAI-API clients against a running `arka serve` (stories260K, --chat-template chatml):
// the official `openai` npm package for completions and chat (JSON and streaming, include_usage,
// n = 2, stop, seed reproducibility, error mapping), 64 concurrent streams whose greedy outputs
// equal the one-at-a-time run, and the `ws` package for the WebSocket (Realtime-style) protocol
// including cancel. Usage: node serve_clients.mjs NPM_CACHE BASE_URL MODEL_ID
// Prints "N passed, N failed" last; exit 1 on any failure.
import { createRequire } from 'node:module';
import path from 'node:path';

const [cache, base, model] = process.argv.slice(2);
const require = createRequire(path.join(cache, 'node_modules', 'x.js'));
const OpenAI = require('openai').default ?? require('openai');
const WebSocket = require('ws');

let passed = 0, failed = 0;
function check(cond, what) {
  if (cond) passed++;
  else { failed++; console.log(`FAIL ${what}`); }
}
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const PROMPT = 'Once upon a time';

async function expectError(p, status, what, code) {
  try { await p; check(false, `${what}: no error`); }
  catch (e) {
    check(e.status === status, `${what}: status ${e.status} (want ${status})`);
    if (code) check(e.code === code || e.error?.code === code, `${what}: code ${e.code ?? e.error?.code} (want ${code})`);
    check(e instanceof OpenAI.APIError, `${what}: an OpenAI.APIError`);
  }
}

async function streamText(params) {
  const s = await client.completions.create({ ...params, stream: true });
  let text = '', finish = null, chunks = 0;
  for await (const c of s) {
    chunks++;
    if (c.choices.length) { text += c.choices[0].text; finish = c.choices[0].finish_reason ?? finish; }
  }
  return { text, finish, chunks };
}

// ---- completions ------------------------------------------------------------------------------
const greedy = await client.completions.create({ model, prompt: PROMPT, max_tokens: 48, temperature: 0 });
check(greedy.object === 'text_completion' && greedy.choices.length === 1, 'completion object');
check(greedy.choices[0].text.startsWith(', there was a little girl named Lily.'), `greedy text: ${JSON.stringify(greedy.choices[0].text)}`);
check(greedy.choices[0].finish_reason === 'length', 'finish length');
check(greedy.usage.prompt_tokens === 5 && greedy.usage.completion_tokens === 48 && greedy.usage.total_tokens === 53, `usage ${JSON.stringify(greedy.usage)}`);

const st = await streamText({ model, prompt: PROMPT, max_tokens: 48, temperature: 0 });
check(st.text === greedy.choices[0].text, 'streamed text == JSON text');
check(st.finish === 'length' && st.chunks >= 10, `stream finish ${st.finish}, ${st.chunks} chunks`);

{ // include_usage: last chunk has usage and no choices
  const s = await client.completions.create({ model, prompt: PROMPT, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let last = null, ids = new Set();
  for await (const c of s) { last = c; ids.add(c.id); }
  check(last && last.choices.length === 0 && last.usage?.completion_tokens === 8, 'include_usage final chunk');
  check(ids.size === 1, 'one id across chunks');
}
{ // n = 2 with a seed: two choices, both complete, reproducible
  const p = { model, prompt: PROMPT, max_tokens: 24, temperature: 1.0, seed: 7, n: 2 };
  const a = await client.completions.create(p), b = await client.completions.create(p);
  check(a.choices.length === 2 && a.choices.map(c => c.index).sort().join() === '0,1', 'n=2 choices');
  check(a.choices[0].text === b.choices[0].text && a.choices[1].text === b.choices[1].text, 'seed reproducible (n=2)');
  check(a.usage.completion_tokens === 48, `n=2 usage ${a.usage.completion_tokens}`);
  const c = await client.completions.create({ ...p, seed: 8, n: 1 });
  const d = await client.completions.create({ ...p, seed: 8, n: 1 });
  check(c.choices[0].text === d.choices[0].text, 'seed 8 reproducible');
  check(c.choices[0].text !== a.choices[0].text, 'another seed, another text');
}
{ // stop strings, across tokens (" girl" is " g" + "ir" + "l" in this vocabulary)
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 40, temperature: 0, stop: [' girl', 'zzz'] });
  check(r.choices[0].text === ', there was a little' && r.choices[0].finish_reason === 'stop', `stop: ${JSON.stringify(r.choices[0])}`);
  const s = await streamText({ model, prompt: PROMPT, max_tokens: 40, temperature: 0, stop: ' girl' });
  check(s.text === ', there was a little' && s.finish === 'stop', `stream stop: ${JSON.stringify(s)}`);
}
{ // logprobs
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 4, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  check(lp && lp.tokens.length === 4 && lp.top_logprobs.length === 4 && Object.keys(lp.top_logprobs[0]).length === 2, 'completion logprobs');
}
// errors mapped by the client library
await expectError(client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 }), 404, 'unknown model', 'model_not_found');
await expectError(client.completions.create({ model, prompt: 'x', max_tokens: 1, temperature: 7 }), 400, 'temperature 7');
await expectError(client.completions.create({ model, prompt: PROMPT, max_tokens: 5000 }), 400, 'context length', 'context_length_exceeded');
await expectError(client.completions.create({ model, prompt: PROMPT, max_tokens: 4, logit_bias: { '99999': 5 } }), 400, 'logit_bias out of vocabulary');

// ---- chat -------------------------------------------------------------------------------------
const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Tell me about Lily.' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
check(chat.object === 'chat.completion' && chat.choices[0].message.role === 'assistant', 'chat object');
check(typeof chat.choices[0].message.content === 'string' && chat.usage.completion_tokens === 16, 'chat content + usage');
check(chat.usage.prompt_tokens > 20, `chat prompt rendered by the template (${chat.usage.prompt_tokens} tokens)`);
{
  const s = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let first = null, text = '', finish = null, usage = null;
  for await (const c of s) {
    if (!first) first = c;
    if (c.choices.length) { text += c.choices[0].delta.content ?? ''; finish = c.choices[0].finish_reason ?? finish; }
    if (c.usage) usage = c.usage;
  }
  check(first.choices[0].delta.role === 'assistant' && first.choices[0].delta.content === '', 'first chat chunk carries the role');
  check(text === chat.choices[0].message.content && finish === 'length', 'chat stream == chat JSON');
  check(usage && usage.completion_tokens === 16, 'chat include_usage');
}
await expectError(client.chat.completions.create({ model, messages: [], max_tokens: 4 }), 400, 'empty messages');

// ---- 64 concurrent streams: greedy outputs equal the one-at-a-time runs --------------------------
{
  const prompts = ['Once upon a time', 'The cat', 'Lily and Ben', 'One day, a big dog', 'Tim was sad because', 'The sun', 'She wanted to', 'In the park'];
  const alone = [];
  for (const p of prompts) alone.push((await client.completions.create({ model, prompt: p, max_tokens: 40, temperature: 0 })).choices[0].text);
  const jobs = [];
  for (let i = 0; i < 64; i++) jobs.push(streamText({ model, prompt: prompts[i % 8], max_tokens: 40, temperature: 0 }));
  const t0 = Date.now();
  const res = await Promise.all(jobs);
  const ms = Date.now() - t0;
  let same = 0;
  res.forEach((r, i) => { if (r.text === alone[i % 8] && r.finish === 'length') same++; });
  check(same === 64, `64 concurrent streams: ${same}/64 equal to the single runs`);
  console.log(`64 concurrent streams of 40 tokens: ${ms} ms`);
}

// ---- WebSocket ----------------------------------------------------------------------------------
function wsSession(fn) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${base.replace('http', 'ws')}/v1/ws`);
    const events = [];
    const waiters = [];
    ws.on('message', d => {
      const ev = JSON.parse(d.toString());
      events.push(ev);
      for (const w of waiters.splice(0)) w();
    });
    ws.on('error', reject);
    const until = (pred, ms = 20000) => new Promise((res, rej) => {
      const t0 = Date.now();
      const test = () => {
        const hit = events.find(pred);
        if (hit) return res(hit);
        if (Date.now() - t0 > ms) return rej(new Error('timeout'));
        waiters.push(test);
        setTimeout(() => { const i = waiters.indexOf(test); if (i >= 0) { waiters.splice(i, 1); test(); } }, 200);
      };
      test();
    });
    ws.on('open', async () => {
      try { await fn(ws, events, until); ws.close(1000); resolve(); } catch (e) { ws.close(); reject(e); }
    });
  });
}
await wsSession(async (ws, events, until) => {
  ws.send(JSON.stringify({ type: 'response.create', event_id: 'c1', response: { messages, max_tokens: 12, temperature: 0 } }));
  ws.send(JSON.stringify({ type: 'response.create', event_id: 'c2', response: { messages, max_tokens: 6, temperature: 0 } }));
  const created = await until(e => e.type === 'response.created');
  check(created.response?.status === 'in_progress', 'ws response.created');
  await until(e => e.type === 'response.done' && e.response.usage?.output_tokens === 6);
  const done = await until(e => e.type === 'response.done' && e.response.usage?.output_tokens === 12);
  check(done.response.status === 'incomplete' && done.response.status_details?.reason === 'max_output_tokens',
        `ws response.done at max_tokens: incomplete/max_output_tokens (${JSON.stringify(done.response.status_details)})`);
  const rid = done.response.id;
  const text = events.filter(e => e.type === 'response.output_text.delta' && e.response_id === rid).map(e => e.delta).join('');
  check(text === chat.choices[0].message.content.slice(0, text.length) && text.length > 0, `ws deltas equal the chat text (${JSON.stringify(text)})`);
  check(events.filter(e => e.type === 'response.done').length === 2, 'two concurrent responses on one socket');
  // cancel a long response: the cancel follows the create on the same socket, so the server
  // handles it while the response is in progress (8 choices of up to 2000 tokens: seconds of work)
  const nDone = events.filter(e => e.type === 'response.done').length;
  ws.send(JSON.stringify({ type: 'response.create', response: { messages, max_tokens: 1900, temperature: 0, n: 8 } }));
  ws.send(JSON.stringify({ type: 'response.cancel' }));
  const cd = await until(e => e.type === 'response.done' && events.filter(x => x.type === 'response.done').indexOf(e) === nDone);
  check(cd.response.status === 'cancelled', `ws cancel -> ${cd.response.status}`);
  check((cd.response.usage?.output_tokens ?? 0) < 16000, `ws cancel stopped generation (${cd.response.usage?.output_tokens} tokens)`);
  ws.send('{"type":"nonsense"}');
  const err = await until(e => e.type === 'error' && e.error?.code === 'unknown_event_type');
  check(err.error?.code === 'unknown_event_type', `ws unknown event -> error event (${JSON.stringify(err)})`);
  const pong = new Promise(res => ws.once('pong', res));
  ws.ping('x');
  await pong;
  check(true, 'ws ping/pong');
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
