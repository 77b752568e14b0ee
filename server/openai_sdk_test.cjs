// Drives the built twinstep-serve binary with the official OpenAI Node SDK (npm `openai`,
// installed by .ci/deps outside the source tree; NODE_PATH points at it): completions,
// streaming with and without include_usage, models, and errors raised as the SDK's typed
// errors (BadRequestError, NotFoundError, AuthenticationError) with a wrong and a missing
// API key. A second server, `--model gemma4-12b --tokenizer DIR` (the Gemma 3 tokenizer from
// .ci/deps), takes text: completions.create({prompt: 'Hello'}) and chat.completions.create,
// streaming and not, with logprobs / top_logprobs, n > 1 and echo. Usage: node openai_sdk_test.cjs TWINSTEP_SERVE_BINARY TOKENIZER_DIR. A
// missing SDK or tokenizer fails.
'use strict';
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const OpenAI = require('openai');

const KEY = 'sk-twinstep-sdk-test';
const tests = [];
const test = (name, fn) => tests.push({ name, fn });

function startServer(binary, extraArgs = []) {
  return new Promise((resolve, reject) => {
    const args = ['--port', '0', '--api-key', KEY, '--sim-step-us', '200', ...extraArgs];
    const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
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
    // A text prompt without --tokenizer (Cyrillic here: its echo once cut a character and
    // crashed the server); the error says which flag would take it.
    await expectError(
        client.completions.create({
          model: 'twinstep-sim', prompt: ['Привет! Расскажи мне историю о драконе'],
          max_tokens: 16,
        }),
        OpenAI.BadRequestError, 400, (e) => {
          assert.equal(e.param, 'prompt');
          assert.match(e.message, /--tokenizer/);
        });
    await expectError(
        client.chat.completions.create({
          model: 'twinstep-sim', messages: [{ role: 'user', content: 'hi' }],
        }),
        OpenAI.BadRequestError, 400, (e) => assert.match(e.message, /--tokenizer/));
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

const TEXT_MODEL = 'gemma4-12b';

function registerText(base) {
  const client = new OpenAI({ apiKey: KEY, baseURL: base, maxRetries: 0, timeout: 60000 });
  const chat = {
    model: TEXT_MODEL, max_tokens: 12, temperature: 0, seed: 4,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi there' }],
  };

  test('text: completions.create with a string prompt', async () => {
    const r = await client.completions.create({ model: TEXT_MODEL, prompt: 'Hello',
                                                max_tokens: 8, ignore_eos: true });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    assert.equal(typeof r.choices[0].text, 'string');
    assert.ok(r.choices[0].text.length > 0, 'the text of 8 tokens is not empty');
    assert.doesNotMatch(r.choices[0].text, /^\d+( \d+)*$/, 'text, not ids joined');
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.deepEqual(r.usage, { prompt_tokens: 2, completion_tokens: 8, total_tokens: 10 });
    // A list of strings: one choice each.
    const two = await client.completions.create({ model: TEXT_MODEL, prompt: ['Hello', 'Bonjour'],
                                                  max_tokens: 3 });
    assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
  });

  test('text: a stop string ends the completion with finish_reason stop', async () => {
    const base = { model: TEXT_MODEL, prompt: 'Once', max_tokens: 24, temperature: 0, seed: 9,
                   ignore_eos: true };
    const free = (await client.completions.create(base)).choices[0].text;
    const chars = Array.from(free);
    assert.ok(chars.length > 8, free);
    const stop = chars.slice(4, 7).join('');
    const r = await client.completions.create({ ...base, stop: [stop] });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].text, free.slice(0, free.indexOf(stop)));
    assert.ok(!r.choices[0].text.includes(stop));
  });

  test('text: chat.completions.create', async () => {
    const r = await client.chat.completions.create(chat);
    assert.equal(r.object, 'chat.completion');
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.model, TEXT_MODEL);
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].index, 0);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.ok(['length', 'stop'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > 5);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  });

  test('text: chat.completions.create streaming: role first, then content', async () => {
    const whole = await client.chat.completions.create(chat);
    const stream = await client.chat.completions.create({
      ...chat, stream: true, stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    let content = '';
    let finish = null;
    for (const c of chunks) {
      for (const choice of c.choices) {
        content += choice.delta.content ?? '';
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    assert.equal(content, whole.choices[0].message.content);
    assert.equal(finish, whole.choices[0].finish_reason);
    const last = chunks[chunks.length - 1];
    assert.deepEqual(last.choices, []);
    assert.deepEqual(last.usage, whole.usage);
  });

  test('text: completions logprobs and echo', async () => {
    const r = await client.completions.create({
      model: TEXT_MODEL, prompt: 'Hello', max_tokens: 6, temperature: 0, ignore_eos: true,
      logprobs: 3,
    });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, 6);
    assert.equal(lp.token_logprobs.length, 6);
    assert.equal(lp.text_offset[0], 0);
    for (let i = 0; i < 6; i++) {
      assert.ok(lp.token_logprobs[i] <= 0, `logprob ${lp.token_logprobs[i]}`);
      const top = lp.top_logprobs[i];
      assert.ok(Object.keys(top).length >= 3 && Object.keys(top).length <= 4, JSON.stringify(top));
      // Greedy: the sampled token is the most likely one.
      assert.equal(Math.max(...Object.values(top)), lp.token_logprobs[i]);
      assert.equal(top[lp.tokens[i]], lp.token_logprobs[i]);
    }
    const stream = await client.completions.create({
      model: TEXT_MODEL, prompt: 'Hello', max_tokens: 6, temperature: 0, ignore_eos: true,
      logprobs: 3, stream: true,
    });
    const streamed = [];
    for await (const chunk of stream) {
      for (const c of chunk.choices) if (c.logprobs) streamed.push(...c.logprobs.token_logprobs);
    }
    assert.deepEqual(streamed, lp.token_logprobs);
    const echoed = await client.completions.create({
      model: TEXT_MODEL, prompt: 'Hello', max_tokens: 6, temperature: 0, ignore_eos: true,
      echo: true,
    });
    assert.equal(echoed.choices[0].text, 'Hello' + r.choices[0].text);
    await expectError(
        client.completions.create({ model: TEXT_MODEL, prompt: 'Hello', logprobs: 6 }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'logprobs'));
    await expectError(
        client.completions.create({ model: TEXT_MODEL, prompt: 'Hello', echo: true, logprobs: 1 }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'echo'));
  });

  test('text: chat logprobs with top_logprobs, streaming and not', async () => {
    const r = await client.chat.completions.create({ ...chat, logprobs: true, top_logprobs: 2 });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, r.usage.completion_tokens -
                 (r.choices[0].finish_reason === 'stop' ? 1 : 0));
    for (const entry of content) {
      assert.equal(typeof entry.token, 'string');
      assert.ok(Array.isArray(entry.bytes));
      assert.equal(entry.top_logprobs.length, 2);
      assert.equal(entry.top_logprobs[0].token, entry.token);  // greedy
      assert.ok(entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob);
    }
    const stream = await client.chat.completions.create({
      ...chat, logprobs: true, top_logprobs: 2, stream: true,
    });
    const streamed = [];
    for await (const chunk of stream) {
      for (const c of chunk.choices) if (c.logprobs) streamed.push(...c.logprobs.content);
    }
    assert.deepEqual(streamed, content);
    await expectError(
        client.chat.completions.create({ ...chat, logprobs: true, top_logprobs: 21 }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'top_logprobs'));
  });

  test('text: n choices, streaming and not', async () => {
    const body = { model: TEXT_MODEL, prompt: 'Once', max_tokens: 5, temperature: 1, seed: 12,
                   ignore_eos: true, n: 3 };
    const r = await client.completions.create(body);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    assert.notEqual(r.choices[0].text + r.choices[1].text + r.choices[2].text, '');
    assert.ok(new Set(r.choices.map((c) => c.text)).size > 1, 'sampled choices differ');
    // The prompt is counted once; every choice's tokens are.
    const single = await client.completions.create({ ...body, n: 1 });
    assert.equal(single.choices[0].text, r.choices[0].text);
    assert.equal(r.usage.prompt_tokens, single.usage.prompt_tokens);
    assert.equal(r.usage.completion_tokens, 15);
    const again = await client.completions.create(body);
    assert.deepEqual(again.choices.map((c) => c.text), r.choices.map((c) => c.text));
    const stream = await client.completions.create({ ...body, stream: true });
    const texts = ['', '', ''];
    for await (const chunk of stream) for (const c of chunk.choices) texts[c.index] += c.text;
    assert.deepEqual(texts, r.choices.map((c) => c.text));
    const chats = await client.chat.completions.create({ ...chat, n: 2, temperature: 1 });
    assert.deepEqual(chats.choices.map((c) => c.index), [0, 1]);
    const chatStream = await client.chat.completions.create({ ...chat, n: 2, stream: true });
    const contents = ['', ''];
    for await (const chunk of chatStream) {
      for (const c of chunk.choices) contents[c.index] += c.delta.content ?? '';
    }
    const whole = await client.chat.completions.create({ ...chat, n: 2 });
    assert.deepEqual(contents, whole.choices.map((c) => c.message.content));
  });

  test('text: chat template errors raise BadRequestError naming messages', async () => {
    await expectError(
        client.chat.completions.create({
          model: TEXT_MODEL,
          messages: [{ role: 'user', content: 'a' }, { role: 'user', content: 'b' }],
        }),
        OpenAI.BadRequestError, 400, (e) => {
          assert.equal(e.param, 'messages');
          assert.match(e.message, /alternate/);
        });
    // <image_soft_token> encodes to id 262144, past the model's 262144 ids.
    await expectError(
        client.completions.create({ model: TEXT_MODEL, prompt: '<image_soft_token>' }),
        OpenAI.BadRequestError, 400, (e) => assert.equal(e.param, 'prompt'));
  });
}

async function main() {
  const binary = process.argv[2];
  const tokenizer = process.argv[3];
  assert.ok(binary && tokenizer,
            'usage: node openai_sdk_test.cjs TWINSTEP_SERVE_BINARY TOKENIZER_DIR');
  console.log('openai SDK ' + require('openai/version').VERSION);
  const { child, port } = await startServer(binary);
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  const text = await startServer(
      binary, ['--model', TEXT_MODEL, '--tokenizer', tokenizer, '--max-context', '4096']);
  const textExited = new Promise((resolve) => text.child.on('exit', (code) => resolve(code)));
  register(`http://127.0.0.1:${port}/v1`);
  registerText(`http://127.0.0.1:${text.port}/v1`);
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
  text.child.kill('SIGTERM');
  let passed = tests.length - failed;
  for (const [name, code] of [['', await exited], [' --tokenizer', await textExited]]) {
    if (code === 0) {
      passed += 1;
    } else {
      failed += 1;
      console.log(`not ok - twinstep-serve${name} exited ${code} after SIGTERM`);
    }
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

main().catch((e) => {
  console.log('not ok - ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
