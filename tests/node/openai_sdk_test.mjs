// The official OpenAI SDK for JavaScript, unchanged, against `loom serve` on
// the bundled model: models.list, chat (plain and streamed), completions
// (plain and streamed), embeddings (floats, and base64, which the SDK asks
// for by default and decodes itself), `model: ""`, and the SDK's errors.
// Usage: node openai_sdk_test.mjs path/to/loom path/to/models/stories260K
// (scripts/openai_sdk_test.sh runs it, skipping loudly without node or the
// SDK).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import OpenAI from 'openai';
import { VERSION } from 'openai/version';

const [loom, model] = process.argv.slice(2);
if (!loom || !model) {
  console.error('usage: node openai_sdk_test.mjs LOOM MODEL_DIR');
  process.exit(2);
}

// Starts `loom serve` on a free port; resolves with the child and its port.
function startServer() {
  const child = spawn(loom, ['serve', '--model', model, '--port', '0'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(
        () => reject(new Error(`no listening line in 60 s:\n${log}`)), 60000);
    child.stderr.on('data', (d) => {
      log += d;
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve({ child, port: Number(m[1]) });
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`loom serve exited (${code}) before listening:\n${log}`));
    });
  });
}

const checks = [];
function check(name, fn) { checks.push({ name, fn }); }

check('models.list', async (c) => {
  const page = await c.models.list();
  assert.equal(page.data.length, 1);
  assert.equal(page.data[0].id, 'stories260K');
  assert.equal(page.data[0].object, 'model');
  assert.equal(page.data[0].owned_by, 'loom');
  assert.ok(Number.isInteger(page.data[0].created) && page.data[0].created > 0);
  const one = await c.models.retrieve('stories260K');
  assert.equal(one.id, 'stories260K');
});

check('chat', async (c) => {
  const r = await c.chat.completions.create({
    model: 'stories260K',
    messages: [{ role: 'user', content: 'Tell me a story.' }],
    max_tokens: 6,
    temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 6);
  assert.equal(r.usage.total_tokens,
               r.usage.prompt_tokens + r.usage.completion_tokens);
});

check('chat, streamed, model ""', async (c) => {
  const plain = await c.chat.completions.create({
    model: '',
    messages: [{ role: 'user', content: 'Tell me a story.' }],
    max_tokens: 6,
    temperature: 0,
  });
  const stream = await c.chat.completions.create({
    model: '',
    messages: [{ role: 'user', content: 'Tell me a story.' }],
    max_tokens: 6,
    temperature: 0,
    stream: true,
  });
  let text = '', finish = null, chunks = 0;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
    ++chunks;
  }
  assert.ok(chunks >= 2, `${chunks} chunks`);
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, 'length');
});

check('completions', async (c) => {
  const r = await c.completions.create({
    model: 'stories260K',
    prompt: 'Once upon a time',
    max_tokens: 5,
    temperature: 0,
    seed: 1,
    stop: ['\n\n'],
  });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.ok(r.choices[0].text.length > 0);
  assert.equal(r.usage.completion_tokens, 5);
  // Several prompts (strings and token ids): one choice each, in order.
  const many = await c.completions.create({
    model: 'stories260K',
    prompt: ['Once upon a time', 'The cat'],
    max_tokens: 3,
    temperature: 0,
  });
  assert.deepEqual(many.choices.map((x) => x.index), [0, 1]);
  assert.equal(many.choices[0].text.slice(0, 3), r.choices[0].text.slice(0, 3));
  const ids = await c.completions.create({
    model: 'stories260K', prompt: [1, 403, 407], max_tokens: 2, temperature: 0,
  });
  assert.equal(ids.usage.prompt_tokens, 3);
});

check('completions, streamed', async (c) => {
  const plain = await c.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 8,
    temperature: 0,
  });
  const stream = await c.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 8,
    temperature: 0, stream: true,
  });
  let text = '', finish = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    text += chunk.choices[0].text;
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(text, plain.choices[0].text);
  assert.equal(finish, 'length');
});

check('embeddings, float and base64', async (c) => {
  const floats = await c.embeddings.create({
    model: 'stories260K', input: ['The cat sat', 'A dog'],
    encoding_format: 'float',
  });
  assert.equal(floats.object, 'list');
  assert.equal(floats.data.length, 2);
  assert.equal(floats.data[1].index, 1);
  assert.equal(floats.data[0].object, 'embedding');
  assert.equal(floats.data[0].embedding.length, 64);
  assert.ok(floats.usage.prompt_tokens > 0);
  assert.equal(floats.usage.total_tokens, floats.usage.prompt_tokens);
  // The SDK's default asks for base64 and decodes it to floats.
  const decoded = await c.embeddings.create({
    model: '', input: ['The cat sat', 'A dog'],
  });
  assert.deepEqual(decoded.data.map((d) => d.embedding),
                   floats.data.map((d) => Array.from(Float32Array.from(
                       d.embedding))));
  const raw = await c.embeddings.create({
    model: 'stories260K', input: 'The cat sat', encoding_format: 'base64',
  });
  assert.equal(typeof raw.data[0].embedding, 'string');
  const bytes = Buffer.from(raw.data[0].embedding, 'base64');
  assert.equal(bytes.length, 64 * 4);
  assert.equal(bytes.readFloatLE(0), Math.fround(floats.data[0].embedding[0]));
});

check('errors are OpenAI errors', async (c) => {
  await assert.rejects(
      c.completions.create({ model: 'stories260K', prompt: 'a', n: 2 }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 &&
          e.param === 'n' && /only 1 is accepted/.test(e.message));
  await assert.rejects(
      c.embeddings.create({ model: 'stories260K', input: 'a', dimensions: 8 }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'dimensions');
  await assert.rejects(
      c.chat.completions.create({ model: 'no-such-model', messages: [
        { role: 'user', content: 'Hi' }] }),
      (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
});

const { child, port } = await startServer();
const client = new OpenAI({
  baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0,
  timeout: 120000,
});
let failed = 0;
for (const { name, fn } of checks) {
  try {
    await fn(client);
    console.log(`ok   ${name}`);
  } catch (e) {
    ++failed;
    console.log(`FAIL ${name}: ${e.stack ?? e}`);
  }
}
child.kill('SIGTERM');
const code = await new Promise((resolve) => child.on('exit', resolve));
if (code !== 0) {
  console.log(`FAIL loom serve exited ${code} after SIGTERM`);
  ++failed;
}
console.log(`openai ${VERSION}: ${checks.length} checks, ${failed} failed`);
process.exit(failed ? 1 : 0);
