/* kvshim inspect: the `kvshim inspect BINARY [--json]` command (design.md §11), on top of
 * tools/inspect/elfscan. Kept apart from kvshim.c so the CLI's main only dispatches to it. */
#ifndef KVSHIM_INSPECT_CMD_H
#define KVSHIM_INSPECT_CMD_H

/* The command's help text (`kvshim help inspect`, `kvshim inspect --help`). */
extern const char kvs_inspect_help[];

/* Runs the command on its arguments (those after "inspect"): prints the report on stdout,
 * errors on stderr. Returns the process exit code: 0 ok, 1 the binary is unreadable or not
 * an ELF executable/shared library, 2 usage. */
int kvs_inspect_main(int argc, char **argv);

#endif
