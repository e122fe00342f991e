/* libsuperprof: an in-process sampling profiler.
 *
 * Link with -lsuperprof (target/release/libsuperprof.so or libsuperprof.a after
 * `cargo build --release`). Samples every thread of the process on its CPU time (SIGPROF from
 * a POSIX timer on each thread's CPU clock, deleted at exec), with call stacks unwound from the
 * modules' CFI (.eh_frame, with framehop; the frame-pointer chain where a module has none, so
 * code without either is best built with -fno-omit-frame-pointer), and symbolizes them at stop with superprof's own symbolizer (ELF symbols,
 * DWARF file:line, inlined frames, demangled C++ and Rust names).
 */
#ifndef SUPERPROF_H
#define SUPERPROF_H

#ifdef __cplusplus
extern "C" {
#endif

/* Starts sampling at 999 Hz. Calling it while sampling does nothing. When the program
 * already has a handler for SIGPROF it refuses, with a message on stderr. */
void perf_start(void);

/* Stops sampling, prints the table of functions by samples and share on stderr and, when the
 * environment variable SUPERPROF_OUTPUT names a file, writes the profile there in the format
 * of its extension (.parquet, .folded, .svg, .pb.gz, .speedscope.json, .firefox.json).
 * Calling it when not sampling does nothing. */
void perf_stop(void);

/* Starts sampling at `hz` (0: 999) and remembers `output` (NULL: SUPERPROF_OUTPUT, if set)
 * for superprof_stop. Returns 0, EALREADY when already sampling, EBUSY when the program has
 * its own SIGPROF handler, or another errno value. */
int superprof_start(const char *output, unsigned hz);

/* Stops sampling, prints the table and writes the output. Returns 0, EINVAL when not
 * sampling, or an errno value of the output file. */
int superprof_stop(void);

#ifdef __cplusplus
}
#endif

#endif
