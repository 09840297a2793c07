// The official `openai` npm client against `arka serve` with API keys: a 429 that says retry
// (concurrency limit, Retry-After: 1) is retried by the client and then succeeds; a 401 is not
// retried; a spent daily budget (x-should-retry: false) is not retried. What the server really
// received is read from /metrics (http_requests_total by status).
// Usage: node auth_clients.mjs NPM_CACHE BASE_URL KEY_CONCURRENCY_1 KEY_DAILY_100
// Prints "N passed, N failed" last.
import { createRequire } from 'node:module';
import path from 'node:path';

const [cache, base, kConc, kDaily] = process.argv.slice(2);
const require = createRequire(path.join(cache, 'node_modules', 'x.js'));
const OpenAI = require('openai').default ?? require('openai');

let passed = 0, failed = 0;
const check = (c, what) => { if (c) passed++; else { failed++; console.log(`FAIL ${what}`); } };
const model = 'stories260K';
const prompt = 'Once upon a time';

async function count(status) {
  const txt = await (await fetch(`${base}/metrics`)).text();
  const m = txt.match(new RegExp(`^arka:http_requests_total\\{[^}]*route="/v1/completions",status="${status}"\\} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : 0;
}

// 1. concurrency 1: B arrives while A streams -> 429 (Retry-After: 1); A is abandoned; the
//    client's retry of B succeeds
{
  const c = new OpenAI({ baseURL: `${base}/v1`, apiKey: kConc, maxRetries: 2, timeout: 30000 });
  const before = await count(429);
  const ac = new AbortController();
  const a = await c.completions.create({ model, prompt, max_tokens: 1900, n: 8, temperature: 0, stream: true }, { signal: ac.signal });
  const it = a[Symbol.asyncIterator]();
  await it.next(); // A is running
  setTimeout(() => ac.abort(), 300);
  const drain = (async () => { try { for (;;) { const r = await it.next(); if (r.done) break; } } catch { /* aborted */ } })();
  const t0 = Date.now();
  let b = null, err = null;
  try { b = await c.completions.create({ model, prompt, max_tokens: 4, temperature: 0 }); } catch (e) { err = e; }
  await drain;
  check(b && b.choices[0].text.length > 0, `B after a retry: ${err ? err.status + ' ' + err.message : 'ok'}`);
  check(Date.now() - t0 >= 900, `the client waited for Retry-After (${Date.now() - t0} ms)`);
  check(await count(429) - before === 1, `one 429 seen by the server (${await count(429) - before})`);
}
// 2. a bad key: 401, not retried
{
  const c = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'ak-' + '0'.repeat(48), maxRetries: 2, timeout: 10000 });
  const before = await count(401);
  let err = null;
  try { await c.completions.create({ model, prompt, max_tokens: 4 }); } catch (e) { err = e; }
  check(err instanceof OpenAI.AuthenticationError && err.status === 401, `401 surfaces as AuthenticationError (${err?.status})`);
  check(await count(401) - before === 1, `401 not retried (${await count(401) - before} requests)`);
}
// 3. a spent daily budget: 429 with x-should-retry: false, not retried
{
  const c = new OpenAI({ baseURL: `${base}/v1`, apiKey: kDaily, maxRetries: 2, timeout: 10000 });
  // the reservation is max_tokens + a prompt bound from the body size (~49 here); usage settles
  const first = await c.completions.create({ model, prompt, max_tokens: 30, temperature: 0 });
  check(first.usage.total_tokens === 35, `first request within the budget (${first.usage.total_tokens} tokens)`);
  const before = await count(429);
  let err = null;
  try { await c.completions.create({ model, prompt, max_tokens: 40 }); } catch (e) { err = e; } // ~89 > 100 - 35
  check(err instanceof OpenAI.RateLimitError && (err.headers?.get?.('x-should-retry') ?? err.headers?.['x-should-retry']) === 'false', `budget spent: 429, x-should-retry false (${err?.status})`);
  check(await count(429) - before === 1, `budget 429 not retried (${await count(429) - before} requests)`);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
