// kvshim e2e: run an unmodified test engine on node-llama-cpp's latest release. Started with
// `node --import <this file>` (or NODE_OPTIONS=--import=<this file>), it resolves every import of
// "node-llama-cpp" (and its subpaths) from this folder, whose node_modules holds the release
// latest/package.json pins, installed beside the pinned 3.21.1 by the same `npm ci` (an npm
// workspace). Node's module customization hooks: https://nodejs.org/api/module.html#customization-hooks
import {register} from "node:module";

register("./redirect_hooks.mjs", import.meta.url);
