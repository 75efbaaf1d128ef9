/* Fused paged decode attention, one ISA variant: lc_kernels.c includes this file once per target
(LC_FN names its functions) so the compiler vectorizes the same plain C for each.

One query token per row. Work items are (row, KV head) pairs: each reads its row's K/V rows in place
through the block table (no gather, no upcast copy of the context) and serves all `group` query heads
of that KV head from one load of each K/V row (GQA). Each chunk of consecutive slots (at most LC_ATT_CHUNK, within one
block) is converted to float32 into a stack buffer in one pass (bf16, or int8 codes times their
per-token scales; a float32 cache is read in place), so the context is never gathered or upcast as a
whole. Softmax is online in float32: per chunk of
positions the running max rises, earlier sums are rescaled by exp(old max - new max). */

#ifndef LC_ATT_LIMITS
#define LC_ATT_LIMITS
#define LC_ATT_MAX_D 256    /* head_dim bound of the stack buffers (kernels.py mirrors both bounds) */
#define LC_ATT_MAX_GROUP 32 /* query heads per KV head */
#define LC_ATT_CHUNK 32     /* positions scored before one softmax rescale */
#define LC_ATT_MIN_PART 128 /* fewest positions worth a work item of their own */
#endif

/* Row `i` of a float32 or bfloat16 matrix as float32: the row itself, or converted into buf. */
static inline const float *LC_FN(att_row)(const void *base, int bf16, int64_t i, int64_t d, float *buf) {
    if (!bf16) return (const float *)base + i * d;
    const uint16_t *src = (const uint16_t *)base + i * d;
#pragma omp simd
    for (int64_t j = 0; j < d; j++) buf[j] = lc_bf16(src[j]);
    return buf;
}

/* Cache element types: LC_KV_F32, LC_KV_BF16, LC_KV_INT8 (lc_kernels.h). */

/* Slots [slot, slot + n) of one K or V head as float32 rows [n, d]: consecutive slots are contiguous
   memory, so a whole chunk converts in one vectorized pass (a float32 cache is read in place). */
static inline const float *LC_FN(att_kv_rows)(const void *base, int type, const float *scales, int64_t slot,
                                              int64_t n, int64_t d, float *buf) {
    if (type == LC_KV_F32) return (const float *)base + slot * d;
    if (type == LC_KV_BF16) {
        const uint16_t *src = (const uint16_t *)base + slot * d;
#pragma omp simd
        for (int64_t i = 0; i < n * d; i++) buf[i] = lc_bf16(src[i]);
        return buf;
    }
    const int8_t *src = (const int8_t *)base + slot * d;
    for (int64_t t = 0; t < n; t++) {
        float sc = scales[slot + t];
#pragma omp simd
        for (int64_t j = 0; j < d; j++) buf[t * d + j] = sc * (float)src[t * d + j];
    }
    return buf;
}

/* The two inner loops of att_pair. Plain C (an omp simd reduction) sums a dot product through a serial
   chain of scalar adds and keeps `acc += w * v` in memory across positions (a store-to-load chain per
   position), so AVX-512 and AVX2 have register forms: one horizontal sum per score, and each 64-value
   slice of an accumulator held in registers over a chunk's positions. */
#if LC_ISA == LC_ISA_AVX512VNNI
static inline float LC_FN(att_dot)(const float *a, const float *b, int64_t d) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= d; j += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j + 16), _mm512_loadu_ps(b + j + 16), s1);
    }
    for (; j < d; j += 16) {
        __mmask16 m = d - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (d - j)) - 1);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + j), _mm512_maskz_loadu_ps(m, b + j), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* acc [d] += sum over t < n of w[t] * rows[t * d ..]: 64 values at a time in four registers. */
static inline void LC_FN(att_accumulate)(float *acc, const float *w, const float *rows, int64_t n, int64_t d) {
    for (int64_t j = 0; j < d; j += 64) {
        __mmask16 m[4];
        __m512 a[4];
        for (int u = 0; u < 4; u++) {
            int64_t left = d - j - 16 * u;
            m[u] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            a[u] = _mm512_maskz_loadu_ps(m[u], acc + j + 16 * u);
        }
        for (int64_t t = 0; t < n; t++) {
            __m512 wt = _mm512_set1_ps(w[t]);
            const float *r = rows + t * d + j;
            for (int u = 0; u < 4; u++) a[u] = _mm512_fmadd_ps(wt, _mm512_maskz_loadu_ps(m[u], r + 16 * u), a[u]);
        }
        for (int u = 0; u < 4; u++) _mm512_mask_storeu_ps(acc + j + 16 * u, m[u], a[u]);
    }
}
#elif LC_ISA == LC_ISA_AVX2
static inline __m256i LC_FN(att_mask8)(int64_t left) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left > 8 ? 8 : left)), lanes);
}

static inline float LC_FN(att_dot)(const float *a, const float *b, int64_t d) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), s1);
    }
    for (; j < d; j += 8) {
        __m256i m = LC_FN(att_mask8)(d - j);
        s0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + j, m), _mm256_maskload_ps(b + j, m), s0);
    }
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* acc [d] += sum over t < n of w[t] * rows[t * d ..]: 32 values at a time in four registers. */
static inline void LC_FN(att_accumulate)(float *acc, const float *w, const float *rows, int64_t n, int64_t d) {
    for (int64_t j = 0; j < d; j += 32) {
        __m256i m[4];
        __m256 a[4];
        for (int u = 0; u < 4; u++) {
            m[u] = LC_FN(att_mask8)(d - j - 8 * u);
            a[u] = _mm256_maskload_ps(acc + j + 8 * u, m[u]);
        }
        for (int64_t t = 0; t < n; t++) {
            __m256 wt = _mm256_set1_ps(w[t]);
            const float *r = rows + t * d + j;
            for (int u = 0; u < 4; u++) a[u] = _mm256_fmadd_ps(wt, _mm256_maskload_ps(r + 8 * u, m[u]), a[u]);
        }
        for (int u = 0; u < 4; u++) _mm256_maskstore_ps(acc + j + 8 * u, m[u], a[u]);
    }
}
#else
static inline float LC_FN(att_dot)(const float *a, const float *b, int64_t d) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < d; j++) s += a[j] * b[j];
    return s;
}

static inline void LC_FN(att_accumulate)(float *acc, const float *w, const float *rows, int64_t n, int64_t d) {
    for (int64_t t = 0; t < n; t++) {
        const float *r = rows + t * d;
#pragma omp simd
        for (int64_t j = 0; j < d; j++) acc[j] += w[t] * r[j];
    }
}
#endif

/* One (row, KV head) pair over positions [first, end) of the row: for each of its query heads the
   unnormalized sum acc [group, d] of exp(score - mx) * value, the max score mx and sum of exp. */
static void LC_FN(att_pair)(const void *q, int q_bf16, int64_t group, int64_t d, const void *k_head,
                            const void *v_head, int cache_type, const float *k_scales,
                            const float *v_scales, const int64_t *table, int64_t block_size,
                            int64_t first, int64_t end, float scale, float softcap, int64_t head0, float *acc,
                            float *mx, float *sum) {
    float qf[LC_ATT_MAX_GROUP * LC_ATT_MAX_D], sc[LC_ATT_MAX_GROUP * LC_ATT_CHUNK];
    float kbuf[LC_ATT_MAX_D], chunk[LC_ATT_CHUNK * LC_ATT_MAX_D];
    for (int64_t g = 0; g < group; g++) {
        const float *row = LC_FN(att_row)(q, q_bf16, head0 + g, d, kbuf);
        for (int64_t j = 0; j < d; j++) qf[g * d + j] = row[j] * scale; /* scale once, not per score */
        mx[g] = -INFINITY;
        sum[g] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)(group * d));
    for (int64_t pos = first; pos < end;) {
        int64_t block = table[pos / block_size], off = pos % block_size;
        int64_t n = block_size - off;
        if (n > end - pos) n = end - pos;
        if (n > LC_ATT_CHUNK) n = LC_ATT_CHUNK;
        int64_t slot = block * block_size + off; /* n consecutive slots of one block */
        const float *keys = LC_FN(att_kv_rows)(k_head, cache_type, k_scales, slot, n, d, chunk);
        for (int64_t g = 0; g < group; g++)
            for (int64_t t = 0; t < n; t++) {
                float s = LC_FN(att_dot)(qf + g * d, keys + t * d, d);
                sc[g * LC_ATT_CHUNK + t] = softcap > 0.0f ? softcap * tanhf(s / softcap) : s;
            }
        for (int64_t g = 0; g < group; g++) {
            float *p = sc + g * LC_ATT_CHUNK, m = mx[g];
#pragma omp simd reduction(max : m)
            for (int64_t t = 0; t < n; t++) m = p[t] > m ? p[t] : m;
            if (m > mx[g]) { /* new max: rescale what was summed under the old one (exp(-inf) = 0) */
                float corr = expf(mx[g] - m);
                sum[g] *= corr;
                for (int64_t j = 0; j < d; j++) acc[g * d + j] *= corr;
                mx[g] = m;
            }
            float part = 0.0f;
#pragma omp simd reduction(+ : part)
            for (int64_t t = 0; t < n; t++) {
                p[t] = lc_exp(p[t] - m);
                part += p[t];
            }
            sum[g] += part;
        }
        const float *values = LC_FN(att_kv_rows)(v_head, cache_type, v_scales, slot, n, d, chunk);
        for (int64_t g = 0; g < group; g++) LC_FN(att_accumulate)(acc + g * d, sc + g * LC_ATT_CHUNK, values, n, d);
        pos += n;
    }
}

#if LC_ISA == LC_ISA_AVX512VNNI
/* 16 bfloat16 values as float32 lanes. */
static inline __m512 LC_FN(att_bf16x16)(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* lc_exp on 16 lanes, the same steps. */
static inline __m512 LC_FN(att_exp16)(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 big = _mm512_set1_ps(12582912.0f);
    __m512 k = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504f), big), big);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

/* att_pair for the commonest shape (head_dim 64, a bfloat16 cache, G <= 4 query heads per KV head:
   SmolLM2, Llama 3.2 1B, TinyLlama, Qwen2.5 0.5B), with G a constant after inlining: the scaled queries
   and every running sum stay in registers, each K and V row is converted once for all G heads, and a
   chunk's softmax is one vector per head. Same contract as att_pair. */
static inline __attribute__((always_inline)) void LC_FN(att_pair_d64)(
    const int G, const float *qf, const uint16_t *k_head, const uint16_t *v_head, const int64_t *table,
    int64_t block_size, int64_t first, int64_t end, float *acc, float *mx, float *sum) {
    __m512 q[4][4], a[4][4];
    float m[4], l[4];
    for (int g = 0; g < G; g++) {
        for (int u = 0; u < 4; u++) {
            q[g][u] = _mm512_loadu_ps(qf + g * 64 + 16 * u);
            a[g][u] = _mm512_setzero_ps();
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    for (int64_t pos = first; pos < end;) {
        int64_t block = table[pos / block_size], off = pos % block_size;
        int64_t n = block_size - off;
        if (n > end - pos) n = end - pos;
        if (n > 16) n = 16;
        const uint16_t *kr = k_head + (block * block_size + off) * 64, *vr = v_head + (block * block_size + off) * 64;
        float sc[4][16];
        for (int64_t t = 0; t < n; t++) {
            __m512 k0 = LC_FN(att_bf16x16)(kr + t * 64), k1 = LC_FN(att_bf16x16)(kr + t * 64 + 16);
            __m512 k2 = LC_FN(att_bf16x16)(kr + t * 64 + 32), k3 = LC_FN(att_bf16x16)(kr + t * 64 + 48);
            for (int g = 0; g < G; g++) {
                __m512 s0 = _mm512_fmadd_ps(q[g][1], k1, _mm512_mul_ps(q[g][0], k0));
                __m512 s1 = _mm512_fmadd_ps(q[g][3], k3, _mm512_mul_ps(q[g][2], k2));
                sc[g][t] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
            }
        }
        __mmask16 live = (__mmask16)((1u << n) - 1);
        for (int g = 0; g < G; g++) {
            __m512 sv = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), live, sc[g]);
            float cm = _mm512_reduce_max_ps(sv);
            if (cm > m[g]) { /* new max: rescale what was summed under the old one (exp(-inf) = 0) */
                float corr = expf(m[g] - cm);
                __m512 c = _mm512_set1_ps(corr);
                l[g] *= corr;
                for (int u = 0; u < 4; u++) a[g][u] = _mm512_mul_ps(a[g][u], c);
                m[g] = cm;
            }
            __m512 pv = _mm512_maskz_mov_ps(live, LC_FN(att_exp16)(_mm512_sub_ps(sv, _mm512_set1_ps(m[g]))));
            l[g] += _mm512_reduce_add_ps(pv);
            _mm512_storeu_ps(sc[g], pv);
        }
        for (int64_t t = 0; t < n; t++) {
            __m512 v0 = LC_FN(att_bf16x16)(vr + t * 64), v1 = LC_FN(att_bf16x16)(vr + t * 64 + 16);
            __m512 v2 = LC_FN(att_bf16x16)(vr + t * 64 + 32), v3 = LC_FN(att_bf16x16)(vr + t * 64 + 48);
            for (int g = 0; g < G; g++) {
                __m512 w = _mm512_set1_ps(sc[g][t]);
                a[g][0] = _mm512_fmadd_ps(w, v0, a[g][0]);
                a[g][1] = _mm512_fmadd_ps(w, v1, a[g][1]);
                a[g][2] = _mm512_fmadd_ps(w, v2, a[g][2]);
                a[g][3] = _mm512_fmadd_ps(w, v3, a[g][3]);
            }
        }
        pos += n;
    }
    for (int g = 0; g < G; g++) {
        for (int u = 0; u < 4; u++) _mm512_storeu_ps(acc + g * 64 + 16 * u, a[g][u]);
        mx[g] = m[g];
        sum[g] = l[g];
    }
}

/* Whether att_pair_fast serves a pair: see att_pair_d64. */
static inline int LC_FN(att_fast_ok)(int64_t group, int64_t d, int cache_type, float softcap) {
    return d == 64 && group <= 4 && cache_type == LC_KV_BF16 && softcap == 0.0f;
}

static void LC_FN(att_pair_fast)(const void *q, int q_bf16, int64_t group, const void *k_head, const void *v_head,
                                 const int64_t *table, int64_t block_size, int64_t first, int64_t end, float scale,
                                 int64_t head0, float *acc, float *mx, float *sum) {
    float qf[4 * 64], kbuf[64];
    for (int64_t g = 0; g < group; g++) {
        const float *row = LC_FN(att_row)(q, q_bf16, head0 + g, 64, kbuf);
        for (int64_t j = 0; j < 64; j++) qf[g * 64 + j] = row[j] * scale;
    }
    const uint16_t *k = (const uint16_t *)k_head, *v = (const uint16_t *)v_head;
    switch (group) {
    case 1: LC_FN(att_pair_d64)(1, qf, k, v, table, block_size, first, end, acc, mx, sum); break;
    case 2: LC_FN(att_pair_d64)(2, qf, k, v, table, block_size, first, end, acc, mx, sum); break;
    case 3: LC_FN(att_pair_d64)(3, qf, k, v, table, block_size, first, end, acc, mx, sum); break;
    default: LC_FN(att_pair_d64)(4, qf, k, v, table, block_size, first, end, acc, mx, sum); break;
    }
}
#endif

/* out rows head0.. = the `parts` partial results of one pair merged under their common max. */
static void LC_FN(att_merge)(int64_t parts, int64_t group, int64_t d, const float *acc, const float *mx,
                             const float *sum, int64_t head0, void *out, int out_bf16) {
    for (int64_t g = 0; g < group; g++) {
        float m = -INFINITY, total = 0.0f, row[LC_ATT_MAX_D] = {0};
        for (int64_t p = 0; p < parts; p++) m = mx[p * group + g] > m ? mx[p * group + g] : m;
        for (int64_t p = 0; p < parts; p++) {
            float w = sum[p * group + g] > 0.0f ? expf(mx[p * group + g] - m) : 0.0f; /* empty part: none */
            total += w * sum[p * group + g];
            const float *a = acc + (p * group + g) * d;
            for (int64_t j = 0; j < d; j++) row[j] += w * a[j];
        }
        float inv = total > 0.0f ? 1.0f / total : 0.0f; /* an empty context reads as zeros */
        for (int64_t j = 0; j < d; j++) lc_store(out, out_bf16, (head0 + g) * d + j, row[j] * inv);
    }
}

/* Work items are (row, KV head, part): a pair's positions split into `parts` ranges when there are
   too few pairs to keep every thread busy (one stream of a model with 3 KV heads), each range's partial
   softmax kept in `scratch` [pairs * parts * group * (d + 2)] floats and merged afterwards. */
static void LC_FN(decode_attention)(const void *q, int q_bf16, int64_t rows, int64_t heads, int64_t kv_heads,
                                    int64_t d, const void *cache, int cache_type, const float *scales,
                                    int64_t num_slots,
                                    const int64_t *tables, int64_t max_blocks, const int64_t *seq_lens,
                                    int64_t block_size, float scale, int64_t window, float softcap, void *out,
                                    int out_bf16, int nth, int64_t parts, float *scratch) {
    int64_t group = heads / kv_heads, pairs = rows * kv_heads;
    int64_t item = cache_type == LC_KV_INT8 ? 1 : cache_type == LC_KV_BF16 ? 2 : 4;
    float *acc = scratch, *mx = acc + pairs * parts * group * d, *sum = mx + pairs * parts * group;
    (void)nth;
#pragma omp parallel num_threads(nth)
    {
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < pairs * parts; it++) {
            int64_t r = it / (kv_heads * parts), h = it / parts % kv_heads, p = it % parts;
            int64_t len = seq_lens[r], first = window > 0 && len > window ? len - window : 0;
            int64_t per = (len - first + parts - 1) / parts, lo = first + p * per;
            int64_t hi = lo + per < len ? lo + per : len;
            const char *k_head = (const char *)cache + h * num_slots * d * item;
            const char *v_head = k_head + kv_heads * num_slots * d * item;
            const float *k_scales = scales ? scales + h * num_slots : NULL; /* [2, kv_heads, num_slots] */
            const float *v_scales = scales ? k_scales + kv_heads * num_slots : NULL;
#if LC_ISA == LC_ISA_AVX512VNNI
            if (LC_FN(att_fast_ok)(group, d, cache_type, softcap)) {
                LC_FN(att_pair_fast)(q, q_bf16, group, k_head, v_head, tables + r * max_blocks, block_size,
                                     lo < hi ? lo : hi, hi, scale, r * heads + h * group, acc + it * group * d,
                                     mx + it * group, sum + it * group);
                continue;
            }
#endif
            LC_FN(att_pair)(q, q_bf16, group, d, k_head, v_head, cache_type, k_scales, v_scales,
                            tables + r * max_blocks, block_size,
                            lo < hi ? lo : hi, hi, scale, softcap, r * heads + h * group, acc + it * group * d,
                            mx + it * group, sum + it * group);
        }
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < pairs; pair++) {
            int64_t off = pair * parts * group, r = pair / kv_heads, h = pair % kv_heads;
            LC_FN(att_merge)(parts, group, d, acc + off * d, mx + off, sum + off, r * heads + h * group, out,
                             out_bf16);
        }
    }
}
