"""The one summary line of a benchmark's repeated figure (the benchmarks under tests/: every
figure is reported as its median, its spread and its count, docs/PERF.md quotes them)."""
import statistics


def spread(name, xs, unit="", width=10, prec=3):
    """'NAME  median M UNIT  [MIN .. MAX]  n=N' of the figures xs."""
    return "%-*s median %9.*f%s  [%.*f .. %.*f]  n=%d" % (
        width, name, prec, statistics.median(xs), f" {unit}" if unit else "", prec, min(xs),
        prec, max(xs), len(xs))
