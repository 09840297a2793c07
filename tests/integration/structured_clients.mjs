// Structured outputs and tool calls through the real clients, unmodified, against a running
// `arka serve` (stories260K, --chat-template chatml): the official `openai` package
// (chat.completions.parse with a zod schema, responses.create, responses.stream, a function
// call round trip), LangChain's ChatOpenAI (withStructuredOutput, bindTools with tool_choice) and
// the Vercel AI SDK (generateObject and tool calls, through @ai-sdk/openai's default model — the
// Responses API — and its chat model).
// Usage: node structured_clients.mjs NPM_PREFIX BASE_URL MODEL_ID. Prints "N passed, N failed".
import { createRequire } from 'node:module';
import path from 'node:path';

const [cache, base, model] = process.argv.slice(2);
const require = createRequire(path.join(cache, 'node_modules', 'x.js'));
const OpenAI = require('openai').default ?? require('openai');
const { zodResponseFormat } = require('openai/helpers/zod');
const { z } = require('zod');
const { ChatOpenAI } = require('@langchain/openai');
const ai = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');

let passed = 0, failed = 0;
function check(cond, what) {
  if (cond) passed++;
  else { failed++; console.log(`FAIL ${what}`); }
}
async function attempt(what, fn) {
  try { await fn(); }
  catch (e) { failed++; console.log(`FAIL ${what}: ${e?.message ?? e} ${e?.error ? JSON.stringify(e.error) : ''}`.slice(0, 900)); }
}

const Person = z.object({
  name: z.string().max(12),
  age: z.number().int().min(0).max(120),
  pet: z.enum(['cat', 'dog']),
  likes: z.array(z.string().max(8)).max(2),
});
const Weather = z.object({ city: z.string().max(10), unit: z.enum(['c', 'f']) });

const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });

// ---- openai ----------------------------------------------------------------------------------
await attempt('openai chat.completions.parse', async () => {
  for (const seed of [1, 2, 3]) {
    const c = await client.chat.completions.parse({
      model, messages: [{ role: 'user', content: 'Describe a person.' }], max_tokens: 300, temperature: 1, seed,
      response_format: zodResponseFormat(Person, 'person'),
    });
    const p = c.choices[0].message.parsed;
    check(p && Person.safeParse(p).success, `parse seed ${seed}: ${JSON.stringify(c.choices[0].message)}`);
  }
});

await attempt('openai responses.create', async () => {
  const r = await client.responses.create({ model, input: 'Tell me a story.', instructions: 'Be brief.', max_output_tokens: 16 });
  check(r.object === 'response' && typeof r.output_text === 'string' && r.output_text.length > 0, `responses.create: ${JSON.stringify(r).slice(0, 300)}`);
  check(r.usage.output_tokens === 16 && r.status === 'incomplete', `responses.create usage/status: ${r.status} ${JSON.stringify(r.usage)}`);
});

await attempt('openai responses.stream', async () => {
  const stream = client.responses.stream({ model, input: [{ role: 'user', content: 'Hello' }], max_output_tokens: 12, temperature: 0 });
  let deltas = '', types = [];
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') deltas += ev.delta;
  }
  const final = await stream.finalResponse();
  check(types[0] === 'response.created' && types.includes('response.output_text.done'), `stream events: ${types.join(',')}`);
  check(final.output_text === deltas && deltas.length > 0, `stream text ${JSON.stringify(deltas)} vs ${JSON.stringify(final.output_text)}`);
});

await attempt('openai responses function call round trip', async () => {
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city',
                   parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 }, unit: { enum: ['c', 'f'] } },
                                 required: ['city', 'unit'], additionalProperties: false }, strict: true }];
  const r = await client.responses.create({ model, input: 'Weather in Oslo?', tools, tool_choice: 'required', parallel_tool_calls: false, max_output_tokens: 200 });
  const call = r.output.find((o) => o.type === 'function_call');
  check(call && call.name === 'get_weather' && Weather.safeParse(JSON.parse(call.arguments)).success, `function_call: ${JSON.stringify(r.output)}`);
  const r2 = await client.responses.create({ model, tools, max_output_tokens: 8,
    input: [{ role: 'user', content: 'Weather in Oslo?' }, call, { type: 'function_call_output', call_id: call.call_id, output: '{"temp": 3}' }] });
  check(r2.status === 'incomplete' || r2.status === 'completed', `round trip: ${r2.status}`);
});

await attempt('openai chat tools streamed', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Weather in Oslo?' }], max_tokens: 200, stream: true,
    tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'] } } }],
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, parallel_tool_calls: false,
  });
  let args = '', name = null, finish = null;
  for await (const c of stream) {
    const d = c.choices[0]?.delta;
    for (const tc of d?.tool_calls ?? []) { name = tc.function?.name ?? name; args += tc.function?.arguments ?? ''; }
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  check(name === 'get_weather' && finish === 'tool_calls' && typeof JSON.parse(args).city === 'string', `stream tool call: ${name} ${finish} ${args}`);
});

// ---- LangChain ------------------------------------------------------------------------------
const llm = new ChatOpenAI({ model, apiKey: 'unused', configuration: { baseURL: `${base}/v1` }, temperature: 1, maxTokens: 300, maxRetries: 0 });

await attempt('langchain withStructuredOutput', async () => {
  for (const method of ['jsonSchema', 'functionCalling']) {
    const p = await llm.withStructuredOutput(Person, { name: 'person', method }).invoke('Describe a person.');
    check(Person.safeParse(p).success, `withStructuredOutput (${method}): ${JSON.stringify(p)}`);
  }
});

await attempt('langchain bindTools', async () => {
  const getWeather = { name: 'get_weather', description: 'Weather of a city', schema: Weather };
  for (const tool_choice of ['get_weather', 'any']) {
    const msg = await llm.bindTools([getWeather], { tool_choice }).invoke('Weather in Oslo?');
    const tc = msg.tool_calls?.[0];
    check(tc && tc.name === 'get_weather' && Weather.safeParse(tc.args).success, `bindTools (${tool_choice}): ${JSON.stringify(msg.tool_calls)}`);
  }
});

// ---- Vercel AI SDK ---------------------------------------------------------------------------
const provider = createOpenAI({ baseURL: `${base}/v1`, apiKey: 'unused' });

await attempt('ai generateObject (responses)', async () => {
  const { object } = await ai.generateObject({ model: provider(model), schema: Person, prompt: 'Describe a person.', maxOutputTokens: 300, maxRetries: 0 });
  check(Person.safeParse(object).success, `generateObject: ${JSON.stringify(object)}`);
});

await attempt('ai generateObject (chat)', async () => {
  const { object } = await ai.generateObject({ model: provider.chat(model), schema: Person, prompt: 'Describe a person.', maxOutputTokens: 300, maxRetries: 0 });
  check(Person.safeParse(object).success, `generateObject chat: ${JSON.stringify(object)}`);
});

for (const [label, m] of [['responses', provider(model)], ['chat', provider.chat(model)]]) {
  await attempt(`ai tool calls (${label})`, async () => {
    const r = await ai.generateText({
      model: m, prompt: 'Weather in Oslo?', maxOutputTokens: 200, maxRetries: 0, toolChoice: 'required',
      tools: { get_weather: ai.tool({ description: 'Weather of a city', inputSchema: Weather }) },
    });
    const tc = r.toolCalls[0];
    check(tc && tc.toolName === 'get_weather' && Weather.safeParse(tc.input).success, `generateText tool call (${label}): ${JSON.stringify(r.toolCalls)}`);
    const s = ai.streamText({
      model: m, prompt: 'Weather in Oslo?', maxOutputTokens: 200, maxRetries: 0,
      toolChoice: { type: 'tool', toolName: 'get_weather' },
      tools: { get_weather: ai.tool({ description: 'Weather of a city', inputSchema: Weather }) },
    });
    const calls = await s.toolCalls;
    check(calls.length >= 1 && calls[0].toolName === 'get_weather' && Weather.safeParse(calls[0].input).success, `streamText tool call (${label}): ${JSON.stringify(calls)}`);
  });
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
