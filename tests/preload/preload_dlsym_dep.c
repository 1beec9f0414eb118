/* tests/preload: dependency of the plugin; only reachable in the plugin's local scope. */
__attribute__((visibility("default"))) int pt_probe(void) { return 'D'; }
__attribute__((visibility("default"))) int pt_dep_only(void) { return 'd'; }
