/* Gated DeltaNet's recurrent form in C, one ISA variant (lc_kernels.c includes this file once per target
after lc_fused.h, LC_FN naming its functions; the export lc_deltanet_step is at the end, once).

It replaces, on CPU, the torch forms of backends/torch/gated_deltanet.py (conv_decode / conv_prefill,
l2_normalize, delta_rule_step / delta_rule_chunked) and the gated RMSNorm after them in qwen3_next.py.
Decode rows: ~30 small torch ops a layer, and a state the torch form gathers, scales, reads three times
and scatters back. Here each row's slot is updated in place, token by token: per value head one read of
its state [dk, dv] (k^T S) and one read-and-write pass (S = a S + k delta^T with o = q^T S on the same
rows). Prefill rows take the same recurrence: a head's 64 KiB state stays in the core's L2 across the
tokens, which beat the chunked form's batched matmuls, triangular solve and padded copies on 2 cores.

Inputs per token (y: the in_proj output, one row of y_stride elements): q|k|v conv channels [C],
z [nv * dv], b [nv], a [nv]. The numerics follow the torch forms: the conv's products, sum and silu
rounded to the compute type as bfloat16 tensors round them, q and k normalised in float32, the state
and the delta rule in float32, the core output rounded before the gated norm as `core.to(x.dtype)`
does. The float32 sums run in another order than torch's, and the recurrence is exact where the chunked
form solves a system (bound in tests/backends/test_deltanet_kernel.py). */

#ifdef LC_FN

/* Phase 1, channels [c0, c1) of one token: the causal conv over the window and the new input, silu, into
   mixed (float32, holding the compute type's value); the window shifts by one in place. round_products:
   each product rounded to the compute type first, as conv_decode's bfloat16 multiply does (a decode
   row); else one float32 sum, as F.conv1d in conv_prefill (a prefill row). */
static void LC_FN(dn_conv)(const void *y, int bf16, void *win, int win_bf16, int64_t width, const float *w,
                           int64_t c0, int64_t c1, int round_products, float *mixed) {
    const int64_t taps = width + 1;
    const int rp = bf16 && round_products;
    for (int64_t c = c0; c < c1; c++) {
        const float x = lc_load(y, bf16, c);
        float acc = 0.0f;
        for (int64_t t = 0; t < width; t++)
            acc += lc_round_as(lc_load(win, win_bf16, c * width + t) * w[c * taps + t], rp);
        acc += lc_round_as(x * w[c * taps + width], rp);
        acc = lc_round_as(acc, bf16);
        mixed[c] = lc_round_as(acc / (1.0f + expf(-acc)), bf16);
        for (int64_t t = 0; t + 1 < width; t++)
            lc_store(win, win_bf16, c * width + t, lc_load(win, win_bf16, c * width + t + 1));
        if (width > 0) lc_store(win, win_bf16, c * width + width - 1, x);
    }
}

/* x / sqrt(sum x^2 + 1e-6) * scale into out, n values. */
static inline void LC_FN(dn_l2)(const float *restrict x, int64_t n, float scale, float *restrict out) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = scale / sqrtf(ss + 1e-6f);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * r;
}

/* Phase 2, one value head of one row: the delta rule on its state S [dk, dv] (float32, in place),
   then the gated RMSNorm of o into out [dv] (compute type). qn, kn: normalised q (scaled) and k [dk];
   v [dv] (float32). tmp: 2 * dv floats. */
static void LC_FN(dn_head)(const float *restrict qn, const float *restrict kn, const float *restrict v, float decay,
                           float beta, float *restrict s, int64_t dk, int64_t dv, const float *restrict norm_w,
                           float eps, const void *z, int bf16, void *out, float *restrict tmp) {
    float *restrict delta = tmp, *restrict o = tmp + dv;
    for (int64_t j = 0; j < dv; j++) delta[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++) { /* k^T S */
        const float ki = kn[i];
        const float *restrict row = s + i * dv;
        for (int64_t j = 0; j < dv; j++) delta[j] += ki * row[j];
    }
    for (int64_t j = 0; j < dv; j++) {
        delta[j] = (v[j] - decay * delta[j]) * beta;
        o[j] = 0.0f;
    }
    for (int64_t i = 0; i < dk; i++) { /* S = a S + k delta^T; o = q^T S */
        const float ki = kn[i], qi = qn[i];
        float *restrict row = s + i * dv;
        for (int64_t j = 0; j < dv; j++) {
            const float updated = decay * row[j] + ki * delta[j];
            row[j] = updated;
            o[j] += qi * updated;
        }
    }
    float ss = 0.0f;
    for (int64_t j = 0; j < dv; j++) {
        o[j] = lc_round_as(o[j], bf16);
        ss += o[j] * o[j];
    }
    const float rstd = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int64_t j = 0; j < dv; j++) {
        const float n = lc_round_as(lc_round_as(o[j] * rstd, bf16) * norm_w[j], bf16);
        const float g = lc_load(z, bf16, j);
        lc_store(out, bf16, j, n * (g / (1.0f + expf(-g))));
    }
}

/* Tokens [t0, t1) of the step, rows given by starts[rows + 1] (token offsets) and their slots: phase 1
   runs the conv of every (row, channel chunk) over the row's tokens in order, phase 2 the delta rule of
   every (row, value head) over them in order (heads are independent, so a prefill row spreads over the
   threads by head). mixed holds phase 1's outputs of tokens [t0, t1). */
static void LC_FN(deltanet_block)(const void *y, int64_t y_stride, int bf16, int64_t rows, const int64_t *starts,
                                  const int64_t *slots, int64_t t0, int64_t t1, void *conv_state, int win_bf16,
                                  int64_t channels, int64_t width, const float *conv_w, float *rec_state, int64_t nk,
                                  int64_t nv, int64_t dk, int64_t dv, const float *neg_a, const float *dt_bias,
                                  const float *norm_w, float eps, void *out, float *mixed, int nth) {
    const size_t es = bf16 ? 2 : 4, ws = win_bf16 ? 2 : 4;
    const int64_t chunk = 512, pieces = (channels + chunk - 1) / chunk, group = nv / nk;
    (void)nth;
#pragma omp parallel num_threads(nth) if ((t1 - t0) * nv > 1)
    {
#pragma omp for schedule(static)
        for (int64_t p = 0; p < rows * pieces; p++) {
            const int64_t r = p / pieces, c0 = (p % pieces) * chunk;
            const int64_t c1 = c0 + chunk < channels ? c0 + chunk : channels;
            const int64_t a0 = starts[r] > t0 ? starts[r] : t0, a1 = starts[r + 1] < t1 ? starts[r + 1] : t1;
            void *win = (char *)conv_state + (size_t)(slots[r] * channels * width) * ws;
            for (int64_t t = a0; t < a1; t++)
                LC_FN(dn_conv)((const char *)y + (size_t)(t * y_stride) * es, bf16, win, win_bf16, width, conv_w, c0,
                               c1, starts[r + 1] - starts[r] == 1, mixed + (t - t0) * channels);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < rows * nv; p++) {
            const int64_t r = p / nv, h = p % nv, kh = h / group;
            const int64_t a0 = starts[r] > t0 ? starts[r] : t0, a1 = starts[r + 1] < t1 ? starts[r + 1] : t1;
            float qn[512], kn[512], tmp[1024]; /* dk, dv <= 512 (checked by the export) */
            float *s = rec_state + ((slots[r] * nv + h) * dk) * dv;
            for (int64_t t = a0; t < a1; t++) {
                const float *m = mixed + (t - t0) * channels;
                const char *yr = (const char *)y + (size_t)(t * y_stride) * es;
                const void *ab = yr + (size_t)(channels + nv * dv) * es; /* b [nv] then a [nv] */
                LC_FN(dn_l2)(m + kh * dk, dk, 1.0f / sqrtf((float)dk), qn);
                LC_FN(dn_l2)(m + nk * dk + kh * dk, dk, 1.0f, kn);
                const float b = lc_load(ab, bf16, h), a = lc_load(ab, bf16, nv + h) + dt_bias[h];
                const float sp = a > 20.0f ? a : log1pf(expf(a)); /* F.softplus, threshold 20 */
                const float decay = expf(neg_a[h] * sp), beta = 1.0f / (1.0f + expf(-b));
                LC_FN(dn_head)(qn, kn, m + 2 * nk * dk + h * dv, decay, beta, s, dk, dv, norm_w, eps,
                               yr + (size_t)(channels + h * dv) * es, bf16,
                               (char *)out + (size_t)((t * nv + h) * dv) * es, tmp);
            }
        }
    }
}

#else /* included once more after the ISA variants and LC_DISPATCH: the export */
/* Per-thread conv outputs of lc_deltanet_step (the caller's thread), grown by lc_grow. */
LC_SCRATCH(lc_dn);
#define LC_DN_BLOCK 128 /* tokens per pass: bounds the conv outputs' scratch (128 x channels floats) */

/* Gated DeltaNet over one step's tokens (above): rows of starts[r] .. starts[r + 1] (token offsets into y,
   starts[0] = 0, increasing; one token for a decode row, more for a prefill row), each continuing the
   state in slots[r]. y [tokens, y_stride] in the compute type (bfloat16 if bf16, else float32) holds per
   token q|k|v [channels], z [nv * dv], b [nv], a [nv]; conv_state [num_slots, channels, width] (bfloat16
   if win_bf16) and rec_state [num_slots, nv, dk, dv] float32 are updated in place; conv_w [channels,
   width + 1], neg_a = -exp(A_log) [nv], dt_bias [nv], norm_w [dv], all float32. out [tokens, nv * dv]
   in the compute type: RMSNorm(o) * silu(z) per head. */
LC_EXPORT int lc_deltanet_step(int isa, const void *y, int64_t y_stride, int bf16, int64_t rows, const int64_t *starts,
                               const int64_t *slots, void *conv_state, int win_bf16, int64_t num_slots, int64_t channels,
                               int64_t width, const float *conv_w, float *rec_state, int64_t nk, int64_t nv, int64_t dk,
                               int64_t dv, const float *neg_a, const float *dt_bias, const float *norm_w, float eps,
                               void *out, int nth) {
    if (!lc_isa_supported(isa) || rows < 0 || nk < 1 || nv < nk || nv % nk || dk < 1 || dk > 512 || dv < 1 ||
        dv > 512 || width < 0 || channels != 2 * nk * dk + nv * dv || y_stride < channels + nv * dv + 2 * nv ||
        nth < 1 || starts[0] != 0)
        return -1;
    for (int64_t r = 0; r < rows; r++)
        if (slots[r] < 0 || slots[r] >= num_slots || starts[r + 1] <= starts[r]) return -1;
    const int64_t tokens = starts[rows];
    float *mixed = (float *)lc_grow(&lc_dn, &lc_dn_size, (size_t)(LC_DN_BLOCK * channels) * 4 + 64);
    if (!mixed) return LC_ENOMEM;
    for (int64_t t0 = 0; t0 < tokens; t0 += LC_DN_BLOCK) {
        const int64_t t1 = t0 + LC_DN_BLOCK < tokens ? t0 + LC_DN_BLOCK : tokens;
        LC_DISPATCH(deltanet_block, y, y_stride, bf16, rows, starts, slots, t0, t1, conv_state, win_bf16, channels,
                    width, conv_w, rec_state, nk, nv, dk, dv, neg_a, dt_bias, norm_w, eps, out, mixed, nth);
    }
    return 0;
}
#endif
