/* Fused paged decode attention, one ISA variant: lc_kernels.c includes this file once per target
(LC_FN names its functions) so the compiler vectorizes the same plain C for each.

One query token per row. Work items are (row, KV head) pairs: each reads its row's K/V rows in place
through the block table (no gather, no upcast copy of the context) and serves all `group` query heads
of that KV head from one load of each K/V row (GQA). Softmax is online in float32: per chunk of
positions the running max rises, earlier sums are rescaled by exp(old max - new max). */

#ifndef LC_ATT_LIMITS
#define LC_ATT_LIMITS
#define LC_ATT_MAX_D 256    /* head_dim bound of the stack buffers */
#define LC_ATT_MAX_GROUP 32 /* query heads per KV head */
#define LC_ATT_CHUNK 32     /* positions scored before one softmax rescale */
#endif

/* Row `i` of a float32 or bfloat16 matrix as float32: the row itself, or converted into buf. */
static inline const float *LC_FN(att_row)(const void *base, int bf16, int64_t i, int64_t d, float *buf) {
    if (!bf16) return (const float *)base + i * d;
    const uint16_t *src = (const uint16_t *)base + i * d;
#pragma omp simd
    for (int64_t j = 0; j < d; j++) buf[j] = lc_bf16(src[j]);
    return buf;
}

static inline float LC_FN(att_dot)(const float *a, const float *b, int64_t d) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < d; j++) s += a[j] * b[j];
    return s;
}

/* One (row, KV head) pair over positions [first, len) of the row. */
static void LC_FN(att_pair)(const void *q, int q_bf16, int64_t group, int64_t d, const void *k_head,
                            const void *v_head, int cache_bf16, const int64_t *table, int64_t block_size,
                            int64_t first, int64_t len, float scale, float softcap, int64_t head0, void *out,
                            int out_bf16) {
    float qf[LC_ATT_MAX_GROUP * LC_ATT_MAX_D], acc[LC_ATT_MAX_GROUP * LC_ATT_MAX_D];
    float sc[LC_ATT_MAX_GROUP * LC_ATT_CHUNK], mx[LC_ATT_MAX_GROUP], sum[LC_ATT_MAX_GROUP];
    float kbuf[LC_ATT_MAX_D], vbuf[LC_ATT_MAX_D];
    for (int64_t g = 0; g < group; g++) {
        const float *row = LC_FN(att_row)(q, q_bf16, head0 + g, d, kbuf);
        for (int64_t j = 0; j < d; j++) qf[g * d + j] = row[j] * scale; /* scale once, not per score */
        mx[g] = -INFINITY;
        sum[g] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)(group * d));
    for (int64_t pos = first; pos < len;) {
        int64_t block = table[pos / block_size], off = pos % block_size;
        int64_t n = block_size - off;
        if (n > len - pos) n = len - pos;
        if (n > LC_ATT_CHUNK) n = LC_ATT_CHUNK;
        int64_t slot = block * block_size + off; /* n consecutive slots of one block */
        for (int64_t t = 0; t < n; t++) {
            const float *kr = LC_FN(att_row)(k_head, cache_bf16, slot + t, d, kbuf);
            for (int64_t g = 0; g < group; g++) {
                float s = LC_FN(att_dot)(qf + g * d, kr, d);
                sc[g * LC_ATT_CHUNK + t] = softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
            }
        }
        for (int64_t g = 0; g < group; g++) {
            float *p = sc + g * LC_ATT_CHUNK, m = mx[g];
            for (int64_t t = 0; t < n; t++) m = p[t] > m ? p[t] : m;
            if (m > mx[g]) { /* new max: rescale what was summed under the old one (exp(-inf) = 0) */
                float corr = expf(mx[g] - m);
                sum[g] *= corr;
                for (int64_t j = 0; j < d; j++) acc[g * d + j] *= corr;
                mx[g] = m;
            }
            for (int64_t t = 0; t < n; t++) {
                p[t] = expf(p[t] - m);
                sum[g] += p[t];
            }
        }
        for (int64_t t = 0; t < n; t++) {
            const float *vr = LC_FN(att_row)(v_head, cache_bf16, slot + t, d, vbuf);
            for (int64_t g = 0; g < group; g++) {
                float w = sc[g * LC_ATT_CHUNK + t], *a = acc + g * d;
#pragma omp simd
                for (int64_t j = 0; j < d; j++) a[j] += w * vr[j];
            }
        }
        pos += n;
    }
    for (int64_t g = 0; g < group; g++) {
        float inv = sum[g] > 0.0f ? 1.0f / sum[g] : 0.0f; /* an empty context reads as zeros */
        for (int64_t j = 0; j < d; j++) lc_store(out, out_bf16, (head0 + g) * d + j, acc[g * d + j] * inv);
    }
}

static void LC_FN(decode_attention)(const void *q, int q_bf16, int64_t rows, int64_t heads, int64_t kv_heads,
                                    int64_t d, const void *cache, int cache_bf16, int64_t num_slots,
                                    const int64_t *tables, int64_t max_blocks, const int64_t *seq_lens,
                                    int64_t block_size, float scale, int64_t window, float softcap, void *out,
                                    int out_bf16, int nth) {
    int64_t group = heads / kv_heads, item = cache_bf16 ? 2 : 4;
    (void)nth;
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(nth)
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t h = 0; h < kv_heads; h++) {
            int64_t len = seq_lens[r], first = window > 0 && len > window ? len - window : 0;
            const char *k_head = (const char *)cache + h * num_slots * d * item;
            const char *v_head = k_head + kv_heads * num_slots * d * item;
            LC_FN(att_pair)(q, q_bf16, group, d, k_head, v_head, cache_bf16, tables + r * max_blocks,
                            block_size, first, len, scale, softcap, r * heads + h * group, out, out_bf16);
        }
    }
}
