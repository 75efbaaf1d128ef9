/* Greedy sampling's argmax read from the logits' bit patterns (the torch backend's sampler.greedy_tokens):
one pass over a row instead of numpy's argmax and max passes and their calls, which on the engine thread
run on caches the weight streaming has just emptied (#34).

Positive floats order as their bit patterns do as signed integers, above every negative float's pattern.
So where a row's largest signed pattern is a positive, non-NaN number, the first index of that pattern is
`row.float().argmax()`, provided no pattern is a NaN with the sign bit set (that NaN would be torch's
answer: it picks the first NaN). A row is read in chunks: each chunk's signed maximum and unsigned
maximum (the latter tells about negative NaNs), the first chunk holding the row's maximum remembered,
then that chunk alone scanned again for its first index. Any other row (a NaN in it, or a maximum that
is zero or negative) answers -1, and the caller takes its exact general path. Plain C loops of max
reductions: the compiler vectorizes them at the baseline ISA. Included once (no per-ISA copies). */

#define LC_ARGMAX_CHUNK 512

#define LC_ARGMAX_ROW(name, int_t, uint_t, int_min, inf, neg_inf)                                          \
    static int64_t name(const int_t *x, int64_t n) {                                                         \
        int_t best = int_min;                                                                                \
        int64_t at = -1;                                                                                     \
        uint_t umax = 0;                                                                                     \
        for (int64_t c = 0; c < n; c += LC_ARGMAX_CHUNK) {                                                   \
            const int64_t e = n - c < LC_ARGMAX_CHUNK ? n : c + LC_ARGMAX_CHUNK;                            \
            int_t m = int_min;                                                                               \
            uint_t u = 0;                                                                                    \
            for (int64_t i = c; i < e; i++) {                                                                \
                const int_t v = x[i];                                                                        \
                const uint_t w = (uint_t)v;                                                                  \
                m = v > m ? v : m;                                                                           \
                u = w > u ? w : u;                                                                           \
            }                                                                                                \
            if (m > best) {                                                                                  \
                best = m;                                                                                    \
                at = c;                                                                                      \
            }                                                                                                \
            umax = u > umax ? u : umax;                                                                      \
        }                                                                                                    \
        if (at < 0 || best <= 0 || best > (inf) || umax > (uint_t)(neg_inf))                                 \
            return -1;                                                                                       \
        const int64_t e = n - at < LC_ARGMAX_CHUNK ? n : at + LC_ARGMAX_CHUNK;                              \
        for (int64_t i = at; i < e; i++)                                                                     \
            if (x[i] == best)                                                                                \
                return i;                                                                                    \
        return -1;                                                                                           \
    }

LC_ARGMAX_ROW(lc_argmax_row16, int16_t, uint16_t, INT16_MIN, 0x7F80, 0xFF80u)
LC_ARGMAX_ROW(lc_argmax_row32, int32_t, uint32_t, INT32_MIN, 0x7F800000, 0xFF800000u)

LC_EXPORT int lc_argmax_rows(const void *x, int bits, int64_t rows, int64_t n, int64_t *out) {
    if ((bits != 16 && bits != 32) || rows < 0 || n <= 0 || !x || !out)
        return LC_EINVAL;
    for (int64_t r = 0; r < rows; r++)
        out[r] = bits == 16 ? lc_argmax_row16((const int16_t *)x + r * n, n)
                            : lc_argmax_row32((const int32_t *)x + r * n, n);
    return LC_OK;
}
