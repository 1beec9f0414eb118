#!/usr/bin/env node
// kvshim e2e test app for the transparent prefix cache (design §10.3): an unmodified engine
// written only against node-llama-cpp's public API (3.21.1). It knows nothing of kvshim: it
// evaluates prompts on the sequences of one context and generates greedily; kvshim, when
// preloaded, may restore a cached prefix underneath it, and the outputs must not change.
//
// usage: node prefix_app.mjs --model PATH --prompts FILE [--sequences N] [--batch-size N]
//            [--ctx-size N] [--tokens N] [--outputs last|all] [--concurrent] [--keep-history]
//            [--kv-key-type T] [--kv-value-type T] [--flash-attention auto|on|off]
// Prompts file (JSON): an array; each item is a string or {"text": ..., "seq": S} or
//   {"tokens": [...], "seq": S}. Text is tokenized by the model (BOS prepended when the model
//   asks for it). The item goes to sequence S (default: item index modulo --sequences).
// For each prompt (in order, one at a time unless --concurrent): the sequence's history is
// cleared (unless --keep-history: the prompt then continues it), then
//   --outputs last   the prompt is evaluated and --tokens tokens are generated greedily
//                    (temperature 0, EOG tokens yielded: generation never stops early);
//   --outputs all    every prompt token asks for an output (controlledEvaluate with
//                    generateNext.token at temperature 0): the per-position next tokens.
// --concurrent evaluates all prompts at once, one per sequence (batches mixing sequences).
// Output: one JSON line per prompt {"prompt", "seq", "prompt_tokens", "ttft_ms", "gen_tokens",
// "gen_text", "next_tokens"} (ttft_ms: prompt start to first generated token) and a summary line
// {"summary": true, "prompts", "ttft_ms_mean", "ttft_ms": [...], "total_ms", "model_load_ms",
// "context_ms"}. Contexts use threads: 1 and are CPU-only.
// Exit status: 0 ok, 1 engine error, 2 bad flags or prompts file.

import fs from "node:fs";
import {parseArgs} from "node:util";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {generate, promptTokens} from "./engine_util.mjs";

const USAGE = "usage: node prefix_app.mjs --model PATH --prompts FILE [--sequences N] " +
    "[--batch-size N] [--ctx-size N] [--tokens N] [--outputs last|all] [--concurrent] " +
    "[--keep-history] [--kv-key-type T] [--kv-value-type T] [--flash-attention auto|on|off]";

function usageError(msg) {
    process.stderr.write(`prefix_app.mjs: ${msg}\n${USAGE}\n`);
    process.exit(2);
}

function intFlag(v, name, min) {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min)
        usageError(`--${name} must be an integer >= ${min}`);
    return n;
}

const round = (x) => Math.round(x * 1000) / 1000;

let args;
try {
    args = parseArgs({options: {
        "model": {type: "string"}, "prompts": {type: "string"},
        "sequences": {type: "string", default: "1"}, "batch-size": {type: "string", default: "512"},
        "ctx-size": {type: "string", default: "4096"}, "tokens": {type: "string", default: "16"},
        "outputs": {type: "string", default: "last"}, "concurrent": {type: "boolean", default: false},
        "keep-history": {type: "boolean", default: false},
        "kv-key-type": {type: "string"}, "kv-value-type": {type: "string"},
        "flash-attention": {type: "string", default: "auto"},
    }}).values;
} catch (err) {
    usageError(err.message);
}
if (!args.model || !args.prompts)
    usageError("--model and --prompts are required");
const nseq = intFlag(args.sequences, "sequences", 1);
const batchSize = intFlag(args["batch-size"], "batch-size", 1);
const ctxSize = intFlag(args["ctx-size"], "ctx-size", 16);
const nTokens = intFlag(args.tokens, "tokens", 1);
if (!["last", "all"].includes(args.outputs))
    usageError("--outputs must be last or all");
if (!["auto", "on", "off"].includes(args["flash-attention"]))
    usageError("--flash-attention must be auto, on or off");
let items;
try {
    items = JSON.parse(fs.readFileSync(args.prompts, "utf8"));
} catch (err) {
    usageError(`--prompts: ${err.message}`);
}
if (!Array.isArray(items) || items.length === 0)
    usageError("--prompts: a non-empty JSON array is required");
if (args.concurrent && items.length > nseq)
    usageError("--concurrent needs one sequence per prompt");

async function main() {
    const tStart = performance.now();
    const llama = await getLlama({gpu: false, build: "never", usePrebuiltBinaries: true,
        progressLogs: false, logLevel: LlamaLogLevel.error});
    const model = await llama.loadModel({modelPath: args.model, gpuLayers: 0});
    const tModel = performance.now();
    const ctxOptions = {contextSize: ctxSize, batchSize: Math.min(batchSize, ctxSize * nseq),
        threads: 1, sequences: nseq};
    if (args["flash-attention"] !== "auto")
        ctxOptions.flashAttention = args["flash-attention"] === "on";
    if (args["kv-key-type"])
        ctxOptions.experimentalKvCacheKeyType = args["kv-key-type"];
    if (args["kv-value-type"])
        ctxOptions.experimentalKvCacheValueType = args["kv-value-type"];
    const context = await model.createContext(ctxOptions);
    const tContext = performance.now();
    const seqs = [];
    for (let i = 0; i < nseq; i++)
        seqs.push(context.getSequence());

    const prompts = items.map((it, i) => {
        const item = typeof it === "string" ? {text: it} : it;
        const tokens = promptTokens(model, item);
        const seq = item.seq ?? i % nseq;
        if (!Number.isInteger(seq) || seq < 0 || seq >= nseq)
            usageError(`--prompts: item ${i} names sequence ${seq}`);
        return {tokens, seq};
    });

    async function one(i) {
        const {tokens, seq: s} = prompts[i];
        const seq = seqs[s];
        const line = {prompt: i, seq: s, prompt_tokens: tokens.length};
        if (!args["keep-history"])
            await seq.clearHistory();
        const t0 = performance.now();
        if (args.outputs === "all") {
            const res = await seq.controlledEvaluate(tokens.map((t) =>
                [t, {generateNext: {token: true, options: {temperature: 0}}}]));
            line.ttft_ms = round(performance.now() - t0);
            line.next_tokens = tokens.map((_, k) => res[k]?.next?.token ?? null);
        } else {
            const {gen, tFirst} = await generate(seq, tokens, nTokens);
            line.ttft_ms = round(tFirst - t0);
            line.gen_tokens = gen;
            line.gen_text = model.detokenize(gen);
        }
        return line;
    }

    const lines = [];
    if (args.concurrent) {
        lines.push(...await Promise.all(prompts.map((_, i) => one(i))));
    } else {
        for (let i = 0; i < prompts.length; i++)
            lines.push(await one(i));
    }
    for (const line of lines)
        process.stdout.write(JSON.stringify(line) + "\n");
    const ttft = lines.map((l) => l.ttft_ms);
    process.stdout.write(JSON.stringify({summary: true, prompts: lines.length,
        ttft_ms_mean: round(ttft.reduce((a, b) => a + b, 0) / ttft.length), ttft_ms: ttft,
        total_ms: round(performance.now() - tStart), model_load_ms: round(tModel - tStart),
        context_ms: round(tContext - tModel)}) + "\n");
    await context.dispose();
    await model.dispose();
}

main().catch((err) => {
    process.stderr.write(`prefix_app.mjs: ${err?.stack ?? err}\n`);
    process.exit(1);
});
