// Prints the node-llama-cpp release the "node-llama-cpp" import resolves to and the llama.cpp
// release of its binaries, as one JSON line: {"node_llama_cpp": "3.22.1", "llama_cpp": "v0.5.0"}.
// check_latest.py runs it with and without latest/redirect.mjs: the engines get the release asked.
import fs from "node:fs";
import {getLlama} from "node-llama-cpp";

const entry = import.meta.resolve("node-llama-cpp");
const pkg = new URL("../package.json", entry.replace(/\/dist\/.*$/, "/dist/"));
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
console.log(JSON.stringify({node_llama_cpp: JSON.parse(fs.readFileSync(pkg, "utf8")).version,
                            llama_cpp: llama.llamaCppRelease.release}));
