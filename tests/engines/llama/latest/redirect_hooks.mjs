// The resolve hook of redirect.mjs (runs on Node's loader thread).
const HERE = new URL("./package.json", import.meta.url).href;

export async function resolve(specifier, context, nextResolve) {
    if (specifier === "node-llama-cpp" || specifier.startsWith("node-llama-cpp/"))
        return nextResolve(specifier, {...context, parentURL: HERE});
    return nextResolve(specifier, context);
}
