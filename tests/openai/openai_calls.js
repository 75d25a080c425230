// The official OpenAI Node client (npm `openai`, pinned by setup_openai.sh) against a running
// `lockstep serve`:  node openai_calls.js BASE_URL MODEL OUT_JSON
// Completions and chat completions, plain and streamed with stream_options.include_usage, with
// `user` and the penalties (presence 0.5, frequency 0.25) set, n = 2, and two seedless sampled chats. Writes
// what each call returned (texts, finish reasons, usage, lockstep objects) for
// openai_client_test.cpp to compare with `lockstep generate`. Any failed call exits 1.
const fs = require('fs');
const OpenAI = require('openai');

const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Name a colour. ü' },
];
const common = { user: 'openai-node-test', presence_penalty: 0.5, frequency_penalty: 0.25, temperature: 0.8 };

async function drain(stream) {
  let text = '', usage = null, lockstep = null, finish = null, chunks = 0, usageChunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    const c = chunk.choices[0];
    if (c) {
      text += c.text ?? c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    } else if (chunk.usage) {
      ++usageChunks;
    }
    if (chunk.usage) usage = chunk.usage;
    if (chunk.lockstep) lockstep = chunk.lockstep;
  }
  return { text, usage, lockstep, finish_reason: finish, chunks, usage_chunks: usageChunks };
}

async function main() {
  const [baseURL, model, outPath] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey: 'test-key', maxRetries: 0, timeout: 120000 });
  const out = {};
  const c = await client.completions.create({ model, prompt: 'Hello, world', max_tokens: 10, seed: 11, ...common });
  out.completion = { text: c.choices[0].text, finish_reason: c.choices[0].finish_reason, usage: c.usage, lockstep: c.lockstep };
  out.completion_stream = await drain(await client.completions.create({
    model, prompt: 'Hello, world', max_tokens: 10, seed: 11, stream: true, stream_options: { include_usage: true }, ...common }));
  const ch = await client.chat.completions.create({ model, messages, max_completion_tokens: 10, seed: 12, ...common });
  out.chat = { text: ch.choices[0].message.content, role: ch.choices[0].message.role,
               finish_reason: ch.choices[0].finish_reason, usage: ch.usage, lockstep: ch.lockstep };
  out.chat_stream = await drain(await client.chat.completions.create({
    model, messages, max_completion_tokens: 10, seed: 12, stream: true, stream_options: { include_usage: true }, ...common }));
  const n2 = await client.chat.completions.create({ model, messages, max_tokens: 10, seed: 13, n: 2, ...common });
  out.chat_n2 = { texts: n2.choices.map((x) => x.message.content), indices: n2.choices.map((x) => x.index), usage: n2.usage };
  const cn2 = await client.completions.create({ model, prompt: 'Hello, world', max_tokens: 10, seed: 14, n: 2, ...common });
  out.completion_n2 = { texts: cn2.choices.map((x) => x.text), indices: cn2.choices.map((x) => x.index) };
  out.seedless = [];
  for (let k = 0; k < 2; ++k) {
    const s = await client.chat.completions.create({ model, messages, max_tokens: 16, ...common });
    out.seedless.push({ text: s.choices[0].message.content, seed: s.lockstep.seed, seed_drawn: s.lockstep.seed_drawn,
                        output_ids: s.lockstep.output_ids });
  }
  fs.writeFileSync(outPath, JSON.stringify(out));
}
main().catch((e) => { console.error(String(e && e.stack || e)); process.exit(1); });
