"""Time intervals from traces ([start, end] lists): their union, and how much of them a cover
leaves uncovered (communication not hidden behind compute). Used by bench.py and tp_overlap.py."""


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def minus_length(intervals, cover):
    # Length of the union of `intervals` outside the union `cover` (both lists of [a, b]).
    total, j = 0.0, 0
    for a, b in union(intervals):
        while j < len(cover) and cover[j][1] <= a:
            j += 1
        k, at = j, a
        while k < len(cover) and cover[k][0] < b:
            if cover[k][0] > at:
                total += cover[k][0] - at
            at = max(at, cover[k][1])
            k += 1
        if at < b:
            total += b - at
    return total
