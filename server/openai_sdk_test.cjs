// Drives the built twinstep-serve binary with the official OpenAI Node SDK (npm `openai`,
// installed by .ci/deps outside the source tree; NODE_PATH points at it): completions,
// streaming with and without include_usage, models, and errors raised as the SDK's typed
// errors (BadRequestError, NotFoundError, AuthenticationError) with a wrong and a missing
// API key. Usage: node openai_sdk_test.cjs TWINSTEP_SERVE_BINARY. A missing SDK fails.
'use strict';
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const OpenAI = require('openai');

const KEY = 'sk-twinstep-sdk-test';
const tests = [];
const test = (name, fn) => tests.push({ name, fn });

function startServer(binary) {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, ['--port', '0', '--api-key', KEY, '--sim-step-us', '200'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    const timer = setTimeout(() => reject(new Error('no listening line in 60 s: ' + out)), 60000);
    child.stdout.on('data', (d) => {
      out += d;
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve({ child, port: Number(m[1]) });
      }
    });
    child.stderr.on('data', (d) => process.stderr.write(d));
    child.on('exit', (code) => reject(new Error('twinstep-serve exited ' + code + ': ' + out)));
  });
}

async function expectError(promise, type, status, check) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof type, `expected ${type.name}, got ${e && e.constructor.name}: ${e}`);
    assert.equal(e.status, status);
    if (check) check(e);
    return;
  }
  assert.fail(`expected ${type.name}, but the call succeeded`);
}

function register(base) {
  const client = new OpenAI({ apiKey: KEY, baseURL: base, maxRetries: 0, timeout: 60000 });

  test('completion with usage', async () => {
    const r = await client.completions.create({
      model: 'twinstep-sim', prompt: [5, 6, 7], max_tokens: 6, temperature: 0, seed: 1,
    });
    assert.equal(r.object, 'text_completion');
    assert.match(r.id, /^cmpl-/);
    assert.equal(r.choices.length, 1);
    assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
    assert.equal(r.usage.prompt_tokens, 3);
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 6);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  });

  test('stream without include_usage has no usage', async () => {
    const stream = await client.completions.create({
      model: 'twinstep-sim', prompt: [9, 10], max_tokens: 20, stream: true, ignore_eos: true,
    });
    let tokens = 0;
    let finish = null;
    for await (const chunk of stream) {
      assert.equal(chunk.usage ?? null, null, 'usage only with include_usage');
      for (const c of chunk.choices) {
        tokens += (c.token_ids || []).length;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(tokens, 20);
    assert.equal(finish, 'length');
  });

  test('stream with include_usage: usage once, in the last chunk', async () => {
    const stream = await client.completions.create({
      model: 'twinstep-sim', prompt: [[1, 2], [3]], max_tokens: 5, stream: true,
      ignore_eos: true, stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const withUsage = chunks.filter((c) => c.usage);
    assert.equal(withUsage.length, 1);
    const last = chunks[chunks.length - 1];
    assert.equal(last, withUsage[0]);
    assert.deepEqual(last.choices, []);
    assert.deepEqual(last.usage, { prompt_tokens: 3, completion_tokens: 10, total_tokens: 13 });
  });

  test('models list and retrieve', async () => {
    const list = await client.models.list();
    assert.equal(list.data[0].id, 'twinstep-sim');
    const model = await client.models.retrieve('twinstep-sim');
    assert.equal(model.id, 'twinstep-sim');
    await expectError(client.models.retrieve('gpt-4'), OpenAI.NotFoundError, 404,
                      (e) => assert.equal(e.code, 'model_not_found'));
  });

  test('bad requests raise BadRequestError naming the param', async () => {
    // A text prompt (Cyrillic here: its echo once cut a character and crashed the server).
    await expectError(
        client.completions.create({
          model: 'twinstep-sim', prompt: ['Привет! Расскажи мне историю о драконе'],
          max_tokens: 16,
        }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'prompt'));
    await expectError(
        client.completions.create({ model: 'twinstep-sim', prompt: [1], temperature: 2.5 }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'temperature'));
    await expectError(
        client.completions.create({ model: 'twinstep-sim', prompt: [1], presence_penalty: 1 }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'presence_penalty'));
    await expectError(
        client.completions.create({ model: 'twinstep-sim', prompt: [1, 2], max_tokens: 100000 }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.code, 'context_length_exceeded'));
    await expectError(client.completions.create({ model: 'nope', prompt: [1] }),
                      OpenAI.NotFoundError, 404, (e) => assert.equal(e.code, 'model_not_found'));
  });

  test('a wrong API key raises AuthenticationError', async () => {
    const wrong = new OpenAI({ apiKey: 'sk-wrong', baseURL: base, maxRetries: 0 });
    await expectError(wrong.models.list(), OpenAI.AuthenticationError, 401,
                      (e) => assert.equal(e.code, 'invalid_api_key'));
    await expectError(wrong.completions.create({ model: 'twinstep-sim', prompt: [1] }),
                      OpenAI.AuthenticationError, 401);
  });

  test('a missing API key is a 401 in the OpenAI error shape', async () => {
    // The SDK refuses to send without a key; a plain request shows what it would get.
    const r = await fetch(base + '/models');
    assert.equal(r.status, 401);
    const body = await r.json();
    assert.equal(body.error.code, 'invalid_api_key');
    assert.equal(body.error.type, 'invalid_request_error');
    assert.equal((await fetch(base.replace('/v1', '/health'))).status, 200);
  });
}

async function main() {
  const binary = process.argv[2];
  assert.ok(binary, 'usage: node openai_sdk_test.cjs TWINSTEP_SERVE_BINARY');
  console.log('openai SDK ' + require('openai/version').VERSION);
  const { child, port } = await startServer(binary);
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  register(`http://127.0.0.1:${port}/v1`);
  let failed = 0;
  for (const t of tests) {
    try {
      await t.fn();
      console.log('ok - ' + t.name);
    } catch (e) {
      failed += 1;
      console.log('not ok - ' + t.name + '\n  ' + (e && e.stack ? e.stack : e));
    }
  }
  child.kill('SIGTERM');
  const code = await exited;
  if (code !== 0) {
    failed += 1;
    console.log('not ok - twinstep-serve exited ' + code + ' after SIGTERM');
  }
  console.log(`${tests.length - failed + (code === 0 ? 1 : 0)} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

main().catch((e) => {
  console.log('not ok - ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
