// tests/engines/llama: what the two test engines (app.mjs, prefix_app.mjs) share.

// A prompt item's tokens: its "tokens" array copied, or its "text" tokenized the way
// node-llama-cpp's own completion does (a BOS token first when the model wants one).
export function promptTokens(model, item) {
    if (item.tokens !== undefined)
        return item.tokens.slice();
    const tokens = Array.from(model.tokenize(item.text));
    if (model.tokens.shouldPrependBosToken && model.tokens.bos !== null)
        tokens.unshift(model.tokens.bos);
    return tokens;
}

// Greedy generation on seq after evaluating tokens: up to n tokens (an end-of-generation token
// included) and when the first one came (performance.now(), null if none).
export async function generate(seq, tokens, n) {
    const gen = [];
    let tFirst = null;
    for await (const tok of seq.evaluate(tokens, {temperature: 0, yieldEogToken: true})) {
        if (tFirst === null)
            tFirst = performance.now();
        gen.push(tok);
        if (gen.length >= n)
            break;
    }
    return {gen, tFirst};
}
