#!/usr/bin/env node
// kvshim e2e test app: a prompt-caching "server" written only against node-llama-cpp's public API
// (pinned to 3.21.1 in package.json). It is the unmodified engine that kvshim's llama shim is
// preloaded into; it knows nothing of kvshim.
//
// For each prompt it takes the first K tokens (--prefix-tokens) as the prefix; the prefix's
// files are named <cache-dir>/<sha256 of the prefix token ids as int32 LE>.<ext>:
//   .seqstate  the state, written by LlamaContextSequence.saveStateToFile (through
//              llama_state_seq_save_file), read by loadStateFromFile (llama_state_seq_load_file)
//   .claim     created exclusively (O_EXCL) before saving: one process saves each prefix
//   .saved     created after saveStateToFile returned: "this prefix was saved"
// A prompt whose prefix has a .saved marker loads the state file; any other prompt evaluates its
// prefix and, if it wins the claim, saves it. Loads key on the marker, not on the state file, for
// two reasons: a state file that another process is still writing must never be loaded (the pinned
// llama.cpp aborts the process on a truncated state file: GGML_ASSERT(nread <= state_size)), and
// an interposed save (kvshim with KVSHIM_LLAMA_WRITE_THROUGH=0) may keep the state elsewhere and
// write no file, to serve the later load itself. A load that fails (missing or corrupt file) is
// reported as load_error and the prefix is evaluated instead. Then the app evaluates the rest of
// the prompt and generates N tokens greedily (temperature 0, EOG tokens yielded and fed back, so
// generation never stops early), and prints one JSON line per prompt and a summary line on stdout.
// A crash between claim and marker leaves that prefix unsaved for good (delete the .claim file).
//
// Prompts file (JSON): an array, or {"prompts": [...]}; each item is a string, {"text": "..."}
// (tokenized by the model; BOS prepended when the model asks for it) or {"tokens": [ids...]}
// (used as is); an item may set its own "prefix_tokens". The prefix is at most prompt length - 1
// tokens: the last prompt token is always evaluated, because the logits it yields are not part of
// a saved state.
//
// Per prompt: {"prompt": i, "prompt_tokens": n, "prefix_tokens": k, "prefix_source":
//   "loaded" | "evaluated" | "none", "prefix_match": bool (loaded: do the file's tokens equal the
//   prefix?), "saved": bool (evaluated: this process saved it), "state_file": name, "state_bytes":
//   size, "load_error": text, "prefix_ms": load or evaluation time, "save_ms": save time,
//   "ttft_ms": prompt start to first generated token, "gen_tokens": [...], "gen_ms": first to last
//   generated token, "gen_text": detokenized}
// Summary: {"summary": true, "prompts", "loaded", "evaluated", "none", "saved", "load_errors",
//   "prefix_ms_loaded_mean", "prefix_ms_evaluated_mean", "ttft_ms_mean", "model_load_ms",
//   "context_ms", "total_ms", ...}
//
// Modes: --cache-dir DIR (the server) or --no-cache (same evaluation order, no state files: the
// reference a cached run must match exactly). --one-shot (with --no-cache) evaluates each whole
// prompt in one batch instead of prefix then rest.
//
// Test and benchmark aids (kvshim's e2e checks and A/B runs; the app's behaviour is otherwise
// unchanged):
//   --state-name NAME   every prefix's files are <cache-dir>/NAME.<ext> instead of the sha256 name:
//                       a deliberately wrong cache (another prefix's state under the name a
//                       prompt asks for), for negative controls.
//   --barrier-dir DIR --barrier-count N
//                       after the last prompt, create DIR/done.<pid> and stay alive, context
//                       loaded, until DIR holds N done.* files (or --barrier-timeout-ms passed:
//                       then exit 1), so a process that saved states is still there (as a kvshim
//                       peer) while the others load them; the summary line comes after the wait,
//                       so its cache_dir_bytes sees every process's files.
//   Summary fields state_bytes_written (bytes of the state files this process saved, as found on
//   disk after each save: 0 when an interposed save wrote none) and cache_dir_bytes (bytes of
//   all files in the cache directory when the summary is written).
//
// Contexts always use threads: 1 (node-llama-cpp's default of 4 threads on a 2-core machine runs
// 30-700x slower) and one sequence; the context is CPU-only (gpu: false).
//
// Exit status: 0 on success, 1 on an engine error, 2 on bad flags or a bad prompts file.

import {createHash} from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import {parseArgs} from "node:util";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {generate, promptTokens} from "./engine_util.mjs";

const USAGE = `usage: node app.mjs --model PATH --prompts FILE (--cache-dir DIR | --no-cache)
                   [--tokens N] [--prefix-tokens K] [--ctx-size N] [--batch-size N]
                   [--one-shot] [--log-level error|warn|info|debug] [--state-name NAME]
                   [--barrier-dir DIR --barrier-count N [--barrier-timeout-ms MS]]
  --model PATH         GGUF model file
  --prompts FILE       JSON prompts file (see the header of app.mjs)
  --cache-dir DIR      directory of prefix state files (created if missing)
  --no-cache           no state files: evaluate every prefix (the reference run)
  --tokens N           tokens to generate per prompt (default 16)
  --prefix-tokens K    prefix length in tokens that names and holds the saved state (default 256)
  --ctx-size N         context size in tokens (default 2048)
  --batch-size N       batch size in tokens (default 512)
  --one-shot           with --no-cache: evaluate each prompt in one batch, no prefix split
  --log-level L        node-llama-cpp/llama.cpp log level (default error)
  --state-name NAME    name every prefix's state NAME (a deliberately wrong cache, for tests)
  --barrier-dir DIR    when done, create DIR/done.<pid> and wait until DIR holds
  --barrier-count N    N done.* files (default 1: no wait), then print the summary
  --barrier-timeout-ms MS  give up waiting after MS ms and exit 1 (default 600000)
`;

function usageError(msg) {
    process.stderr.write(`app.mjs: ${msg}\n${USAGE}`);
    process.exit(2);
}

function intFlag(values, name, def, min) {
    const raw = values[name];
    if (raw === undefined)
        return def;
    if (!/^\d+$/.test(raw) || Number(raw) < min)
        usageError(`--${name} must be an integer >= ${min} (got '${raw}')`);
    return Number(raw);
}

function parseFlags(argv) {
    let parsed;
    try {
        parsed = parseArgs({
            args: argv,
            options: {
                model: {type: "string"},
                prompts: {type: "string"},
                "cache-dir": {type: "string"},
                "no-cache": {type: "boolean", default: false},
                tokens: {type: "string"},
                "prefix-tokens": {type: "string"},
                "ctx-size": {type: "string"},
                "batch-size": {type: "string"},
                "one-shot": {type: "boolean", default: false},
                "log-level": {type: "string", default: "error"},
                "state-name": {type: "string"},
                "barrier-dir": {type: "string"},
                "barrier-count": {type: "string"},
                "barrier-timeout-ms": {type: "string"},
                help: {type: "boolean", short: "h", default: false}
            },
            strict: true,
            allowPositionals: false
        });
    } catch (err) {
        usageError(err.message);
    }
    const v = parsed.values;
    if (v.help) {
        process.stdout.write(USAGE);
        process.exit(0);
    }
    if (!v.model)
        usageError("--model is required");
    if (!v.prompts)
        usageError("--prompts is required");
    if (!v["cache-dir"] === !v["no-cache"])
        usageError("give exactly one of --cache-dir DIR and --no-cache");
    if (v["one-shot"] && !v["no-cache"])
        usageError("--one-shot needs --no-cache");
    const levels = {error: LlamaLogLevel.error, warn: LlamaLogLevel.warn,
        info: LlamaLogLevel.info, debug: LlamaLogLevel.debug};
    if (!(v["log-level"] in levels))
        usageError(`--log-level must be one of ${Object.keys(levels).join(", ")}`);
    if (v["state-name"] !== undefined && !/^[A-Za-z0-9._-]+$/.test(v["state-name"]))
        usageError(`--state-name must be a plain file name (got '${v["state-name"]}')`);
    if (v["state-name"] !== undefined && !v["cache-dir"])
        usageError("--state-name needs --cache-dir");
    if ((v["barrier-count"] !== undefined || v["barrier-timeout-ms"] !== undefined) &&
        !v["barrier-dir"])
        usageError("--barrier-count and --barrier-timeout-ms need --barrier-dir");
    const flags = {
        model: v.model,
        prompts: v.prompts,
        cacheDir: v["cache-dir"] ?? null,
        oneShot: v["one-shot"],
        tokens: intFlag(v, "tokens", 16, 1),
        prefixTokens: intFlag(v, "prefix-tokens", 256, 0),
        ctxSize: intFlag(v, "ctx-size", 2048, 16),
        batchSize: intFlag(v, "batch-size", 512, 1),
        logLevel: levels[v["log-level"]],
        stateName: v["state-name"] ?? null,
        barrierDir: v["barrier-dir"] ?? null,
        barrierCount: intFlag(v, "barrier-count", 1, 1),
        barrierTimeoutMs: intFlag(v, "barrier-timeout-ms", 600000, 1)
    };
    if (!fs.existsSync(flags.model))
        usageError(`--model: ${flags.model} does not exist`);
    return flags;
}

function readPrompts(file) {
    let doc;
    try {
        doc = JSON.parse(fs.readFileSync(file, "utf8"));
    } catch (err) {
        usageError(`--prompts: cannot read ${file}: ${err.message}`);
    }
    const items = Array.isArray(doc) ? doc : doc?.prompts;
    if (!Array.isArray(items) || items.length === 0)
        usageError(`--prompts: ${file} must hold a non-empty array (or {"prompts": [...]})`);
    return items.map((it, i) => {
        const where = `--prompts: item ${i}`;
        if (typeof it === "string")
            return {text: it};
        if (it === null || typeof it !== "object")
            usageError(`${where} must be a string or an object`);
        if ((it.text === undefined) === (it.tokens === undefined))
            usageError(`${where} needs exactly one of "text" and "tokens"`);
        if (it.text !== undefined && typeof it.text !== "string")
            usageError(`${where}: "text" must be a string`);
        if (it.tokens !== undefined &&
            (!Array.isArray(it.tokens) || !it.tokens.every((t) => Number.isInteger(t) && t >= 0)))
            usageError(`${where}: "tokens" must be an array of token ids`);
        if (it.prefix_tokens !== undefined &&
            !(Number.isInteger(it.prefix_tokens) && it.prefix_tokens >= 0))
            usageError(`${where}: "prefix_tokens" must be an integer >= 0`);
        return it;
    });
}

// Creates path exclusively; false when it already exists.
function claim(path_) {
    try {
        fs.closeSync(fs.openSync(path_, "wx"));
        return true;
    } catch (err) {
        if (err.code === "EEXIST")
            return false;
        throw err;
    }
}

// Creates the marker atomically (write then rename), so it never exists half-made.
function mark(path_) {
    const tmp = `${path_}.tmp-${process.pid}`;
    fs.writeFileSync(tmp, `${new Date().toISOString()} pid ${process.pid}\n`);
    fs.renameSync(tmp, path_);
}

function prefixKey(prefix) {
    return createHash("sha256").update(Buffer.from(Int32Array.from(prefix).buffer)).digest("hex");
}

// Bytes of the regular files directly in dir (0 when it does not exist).
function dirBytes(dir) {
    let total = 0;
    let names;
    try {
        names = fs.readdirSync(dir);
    } catch {
        return 0;
    }
    for (const n of names) {
        try {
            const st = fs.statSync(path.join(dir, n));
            if (st.isFile())
                total += st.size;
        } catch {
            // removed meanwhile
        }
    }
    return total;
}

// Creates dir/done.<pid>, then waits until dir holds count done.* files; false on timeout.
async function barrier(dir, count, timeoutMs) {
    fs.mkdirSync(dir, {recursive: true});
    mark(path.join(dir, `done.${process.pid}`));
    const deadline = performance.now() + timeoutMs;
    for (;;) {
        const n = fs.readdirSync(dir).filter((x) => /^done\.[^.]+$/.test(x)).length;
        if (n >= count)
            return true;
        if (performance.now() > deadline)
            return false;
        await new Promise((resolve) => setTimeout(resolve, 20));
    }
}

function round(ms) {
    return ms === null ? null : Math.round(ms * 1000) / 1000;
}

function mean(xs) {
    return xs.length === 0 ? null : round(xs.reduce((a, b) => a + b, 0) / xs.length);
}

function sameTokens(a, b) {
    return a.length === b.length && a.every((t, i) => t === b[i]);
}

async function main() {
    const flags = parseFlags(process.argv.slice(2));
    const items = readPrompts(flags.prompts);
    if (flags.cacheDir)
        fs.mkdirSync(flags.cacheDir, {recursive: true});

    const tStart = performance.now();
    const llama = await getLlama({gpu: false, build: "never", usePrebuiltBinaries: true,
        progressLogs: false, logLevel: flags.logLevel});
    const model = await llama.loadModel({modelPath: flags.model, gpuLayers: 0});
    const tModel = performance.now();
    const context = await model.createContext({contextSize: flags.ctxSize,
        batchSize: Math.min(flags.batchSize, flags.ctxSize), threads: 1, sequences: 1});
    const tContext = performance.now();
    const seq = context.getSequence();

    const prompts = items.map((it, i) => {
        const tokens = promptTokens(model, it);
        if (tokens.length === 0)
            usageError(`--prompts: item ${i} has no tokens`);
        if (tokens.length + flags.tokens > context.contextSize)
            usageError(`--prompts: item ${i} needs ${tokens.length} + ${flags.tokens} tokens, ` +
                `more than the context (${context.contextSize}); raise --ctx-size`);
        const want = it.prefix_tokens ?? flags.prefixTokens;
        return {tokens, k: flags.oneShot ? 0 : Math.min(want, tokens.length - 1)};
    });

    const stats = {loaded: [], evaluated: [], ttft: [], loadErrors: 0, saved: 0, bytesWritten: 0};
    for (let i = 0; i < prompts.length; i++) {
        const {tokens, k} = prompts[i];
        const prefix = tokens.slice(0, k);
        const rest = tokens.slice(k);
        const line = {prompt: i, prompt_tokens: tokens.length, prefix_tokens: k};
        await seq.clearHistory();

        const t0 = performance.now();
        if (k === 0) {
            line.prefix_source = "none";
        } else if (!flags.cacheDir) {
            await seq.evaluateWithoutGeneratingNewTokens(prefix);
            line.prefix_source = "evaluated";
            line.prefix_ms = round(performance.now() - t0);
            stats.evaluated.push(line.prefix_ms);
        } else {
            const base = path.join(flags.cacheDir, flags.stateName ?? prefixKey(prefix));
            const file = `${base}.seqstate`;
            line.state_file = path.basename(file);
            let loaded = false;
            if (fs.existsSync(`${base}.saved`)) {
                try {
                    await seq.loadStateFromFile(file, {acceptRisk: true});
                    loaded = true;
                } catch (err) {
                    line.load_error = String(err?.message ?? err);
                    stats.loadErrors++;
                    await seq.clearHistory();
                }
            }
            if (loaded) {
                line.prefix_source = "loaded";
                line.prefix_ms = round(performance.now() - t0);
                line.prefix_match = sameTokens(seq.contextTokens, prefix);
                stats.loaded.push(line.prefix_ms);
            } else {
                await seq.evaluateWithoutGeneratingNewTokens(prefix);
                line.prefix_source = "evaluated";
                line.prefix_ms = round(performance.now() - t0);
                stats.evaluated.push(line.prefix_ms);
                line.saved = !line.load_error && claim(`${base}.claim`);
                if (line.saved) {
                    const t1 = performance.now();
                    await seq.saveStateToFile(file);
                    line.save_ms = round(performance.now() - t1);
                    mark(`${base}.saved`);
                    stats.saved++;
                }
            }
            try {
                line.state_bytes = fs.statSync(file).size;
            } catch {
                line.state_bytes = null;  // an interposed save may write no file
            }
            if (line.saved)
                stats.bytesWritten += line.state_bytes ?? 0;
        }

        const {gen, tFirst} = await generate(seq, rest, flags.tokens);
        const tEnd = performance.now();
        line.ttft_ms = round(tFirst - t0);
        line.gen_tokens = gen;
        line.gen_ms = round(tEnd - tFirst);
        line.gen_text = model.detokenize(gen);
        stats.ttft.push(line.ttft_ms);
        process.stdout.write(JSON.stringify(line) + "\n");
    }

    const tDone = performance.now();
    if (flags.barrierDir &&
        !await barrier(flags.barrierDir, flags.barrierCount, flags.barrierTimeoutMs)) {
        process.stderr.write(`app.mjs: barrier: fewer than ${flags.barrierCount} done.* files ` +
            `in ${flags.barrierDir} after ${flags.barrierTimeoutMs} ms\n`);
        process.exit(1);
    }
    const summary = {
        summary: true,
        prompts: prompts.length,
        loaded: stats.loaded.length,
        evaluated: stats.evaluated.length,
        none: prompts.length - stats.loaded.length - stats.evaluated.length,
        saved: stats.saved,
        load_errors: stats.loadErrors,
        prefix_ms_loaded_mean: mean(stats.loaded),
        prefix_ms_evaluated_mean: mean(stats.evaluated),
        ttft_ms_mean: mean(stats.ttft),
        model_load_ms: round(tModel - tStart),
        context_ms: round(tContext - tModel),
        total_ms: round(tDone - tStart),
        barrier_ms: flags.barrierDir ? round(performance.now() - tDone) : null,
        state_bytes_written: flags.cacheDir ? stats.bytesWritten : null,
        cache_dir_bytes: flags.cacheDir ? dirBytes(flags.cacheDir) : null,
        context_size: context.contextSize,
        batch_size: context.batchSize,
        threads: 1,
        tokens: flags.tokens,
        mode: flags.cacheDir ? "cache" : (flags.oneShot ? "no-cache-one-shot" : "no-cache"),
        model: path.resolve(flags.model)
    };
    process.stdout.write(JSON.stringify(summary) + "\n");
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}

main().catch((err) => {
    process.stderr.write(`app.mjs: ${err?.stack ?? err}\n`);
    process.exit(1);
});
