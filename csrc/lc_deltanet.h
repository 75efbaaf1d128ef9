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
                           int64_t c0, int64_t c1, int round_products, float *mixed, void *kept) {
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
        if (kept) /* a verify row's window after this token, into its spec row */
            for (int64_t t = 0; t < width; t++)
                lc_store(kept, win_bf16, c * width + t, lc_load(win, win_bf16, c * width + t));
    }
}

#define LC_DN_CONV_CH 256 /* channels a conv task holds in registers / L1 (the compute-type loops below) */
#define LC_DN_MAX_WIDTH 7 /* window lengths the blocked conv takes (K <= 8); longer ones take dn_conv */

/* Phase 1 for channels [c0, c0 + n) (n <= LC_DN_CONV_CH) of one row over its tokens [a0, a1): the window
   and the weights are held transposed ([tap][channel]) so each token is a few loops over channels the
   compiler vectorizes (dn_conv walks one channel at a time with a libm expf each); silu through lc_exp.
   The window goes back once, after the row's last token. y points at token a0's row. */
static void LC_FN(dn_conv_block)(const char *y, size_t y_row, int bf16, void *win, int win_bf16, int64_t width,
                                 const float *w, int64_t c0, int64_t n, int64_t a0, int64_t a1, int round_products,
                                 float *mixed, int64_t channels, char *win_all, const int64_t *keep) {
    float xw[LC_DN_MAX_WIDTH + 1][LC_DN_CONV_CH], wt[LC_DN_MAX_WIDTH + 1][LC_DN_CONV_CH], acc[LC_DN_CONV_CH];
    const int64_t taps = width + 1;
    const int rp = bf16 && round_products;
    for (int64_t c = 0; c < n; c++) {
        for (int64_t t = 0; t < width; t++) xw[t][c] = lc_load(win, win_bf16, (c0 + c) * width + t);
        for (int64_t t = 0; t < taps; t++) wt[t][c] = w[(c0 + c) * taps + t];
    }
    for (int64_t t = a0; t < a1; t++) {
        float *x = xw[width]; /* this token's inputs, after the window's width */
        const char *row = y + (size_t)(t - a0) * y_row;
        if (bf16)
            for (int64_t c = 0; c < n; c++) x[c] = lc_bf16(((const uint16_t *)row)[c0 + c]);
        else
            for (int64_t c = 0; c < n; c++) x[c] = ((const float *)row)[c0 + c];
        for (int64_t c = 0; c < n; c++) acc[c] = 0.0f;
        for (int64_t k = 0; k < taps; k++) {
            if (rp)
                for (int64_t c = 0; c < n; c++) acc[c] += lc_bf16(lc_to_bf16(xw[k][c] * wt[k][c]));
            else
                for (int64_t c = 0; c < n; c++) acc[c] += xw[k][c] * wt[k][c];
        }
        float *out = mixed + (t - a0) * channels + c0;
        if (bf16)
            for (int64_t c = 0; c < n; c++) {
                const float v = lc_bf16(lc_to_bf16(acc[c]));
                out[c] = lc_bf16(lc_to_bf16(v / (1.0f + lc_exp(-v))));
            }
        else
            for (int64_t c = 0; c < n; c++) out[c] = acc[c] / (1.0f + lc_exp(-acc[c]));
        for (int64_t k = 0; k < width; k++) /* slide: tap k takes tap k + 1 */
            for (int64_t c = 0; c < n; c++) xw[k][c] = xw[k + 1][c];
        if (keep && keep[t] >= 0) { /* a verify row's window after this token, into its spec row */
            void *kept = win_all + (size_t)(keep[t] * channels * width) * (win_bf16 ? 2 : 4);
            for (int64_t c = 0; c < n; c++)
                for (int64_t k = 0; k < width; k++) lc_store(kept, win_bf16, (c0 + c) * width + k, xw[k][c]);
        }
    }
    for (int64_t c = 0; c < n; c++)
        for (int64_t t = 0; t < width; t++) lc_store(win, win_bf16, (c0 + c) * width + t, xw[t][c]);
}

/* x / sqrt(sum x^2 + 1e-6) * scale into out, n values. */
static inline void LC_FN(dn_l2)(const float *restrict x, int64_t n, float scale, float *restrict out) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = scale / sqrtf(ss + 1e-6f);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * r;
}

/* The gated RMSNorm of one head's o [dv] (float32) into out [dv] (compute type): RMSNorm(o) * silu(z). */
static void LC_FN(dn_gate)(float *restrict o, int64_t dv, const float *restrict norm_w, float eps, const void *z,
                           int bf16, void *out) {
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

/* Phase 2 of a one-token row, one value head: the delta rule on its state S [dk, dv] (float32, in
   place), o into o [dv]. qn, kn: normalised q (scaled) and k [dk]; v [dv] (float32). delta: dv floats. */
static void LC_FN(dn_head)(const float *restrict qn, const float *restrict kn, const float *restrict v, float decay,
                           float beta, float *restrict s, int64_t dk, int64_t dv, float *restrict delta,
                           float *restrict o) {
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
}

/* One token's inputs for value head h: normalised q (scaled) and k [dk] from the conv outputs m, the decay
   a = exp(-exp(A_log) softplus(a + dt_bias)) and beta = sigmoid(b) from the token's b | a (ab). */
static inline void LC_FN(dn_token)(const float *m, const void *ab, int bf16, int64_t nk, int64_t nv, int64_t dk,
                                   int64_t h, int64_t kh, const float *neg_a, const float *dt_bias, float *qn,
                                   float *kn, float *decay, float *beta) {
    LC_FN(dn_l2)(m + kh * dk, dk, 1.0f / sqrtf((float)dk), qn);
    LC_FN(dn_l2)(m + nk * dk + kh * dk, dk, 1.0f, kn);
    const float b = lc_load(ab, bf16, h), a = lc_load(ab, bf16, nv + h) + dt_bias[h];
    const float sp = a > 20.0f ? a : log1pf(expf(a)); /* F.softplus, threshold 20 */
    *decay = expf(neg_a[h] * sp);
    *beta = 1.0f / (1.0f + expf(-b));
}

#define LC_DN_TILE 32 /* state columns a prefill task keeps in L1: dk x 32 floats (16 KiB at dk 128) */

/* Phase 2 of a prefill row, state columns [j0, j0 + LC_DN_TILE) of value head h over tokens [a0, a1):
   the columns evolve independently (k^T S, the update and q^T S are per column), so the tile is copied
   out of the strided state into a contiguous buffer, runs every token there and goes back. One pass a
   token: updating row i also sums the next token's k^T S, which then needs no pass of its own. o of
   each token goes to o_rows (float32, row stride o_stride). */
static void LC_FN(dn_tile)(const float *mixed, int64_t channels, const char *y, size_t y_row, int64_t yb, int bf16,
                           int64_t a0, int64_t a1, int64_t nk, int64_t nv, int64_t dk, int64_t dv, int64_t h,
                           int64_t kh, int64_t j0, const float *neg_a, const float *dt_bias, float *restrict s,
                           float *o_rows, int64_t o_stride) {
    float st[512 * LC_DN_TILE], qa[512], ka[512], qb[512], kb[512];
    float ks[LC_DN_TILE], nks[LC_DN_TILE], delta[LC_DN_TILE], o[LC_DN_TILE];
    float *q = qa, *k = ka, *nq = qb, *nk_ = kb, decay, beta, ndecay = 0.0f, nbeta = 0.0f;
    for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < LC_DN_TILE; j++) st[i * LC_DN_TILE + j] = s[i * dv + j0 + j];
    LC_FN(dn_token)(mixed, y + (size_t)yb, bf16, nk, nv, dk, h, kh, neg_a, dt_bias, q, k, &decay, &beta);
    for (int64_t j = 0; j < LC_DN_TILE; j++) ks[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < LC_DN_TILE; j++) ks[j] += k[i] * st[i * LC_DN_TILE + j];
    for (int64_t t = a0; t < a1; t++) {
        const float *m = mixed + (t - a0) * channels;
        if (t + 1 < a1)
            LC_FN(dn_token)(m + channels, y + (size_t)(t + 1 - a0) * y_row + yb, bf16, nk, nv, dk, h, kh, neg_a,
                            dt_bias, nq, nk_, &ndecay, &nbeta);
        else
            for (int64_t i = 0; i < dk; i++) nk_[i] = 0.0f;
        const float *v = m + 2 * nk * dk + h * dv + j0;
        for (int64_t j = 0; j < LC_DN_TILE; j++) {
            delta[j] = (v[j] - decay * ks[j]) * beta;
            o[j] = nks[j] = 0.0f;
        }
        for (int64_t i = 0; i < dk; i++) {
            const float ki = k[i], qi = q[i], ni = nk_[i];
            float *restrict row = st + i * LC_DN_TILE;
            for (int64_t j = 0; j < LC_DN_TILE; j++) {
                const float updated = decay * row[j] + ki * delta[j];
                row[j] = updated;
                o[j] += qi * updated;
                nks[j] += ni * updated;
            }
        }
        float *dst = o_rows + (t - a0) * o_stride + h * dv + j0;
        for (int64_t j = 0; j < LC_DN_TILE; j++) {
            dst[j] = o[j];
            ks[j] = nks[j];
        }
        float *swap = q;
        q = nq, nq = swap, swap = k, k = nk_, nk_ = swap, decay = ndecay, beta = nbeta;
    }
    for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < LC_DN_TILE; j++) s[i * dv + j0 + j] = st[i * LC_DN_TILE + j];
}

/* Tokens [t0, t1) of the step, rows given by starts[rows + 1] (token offsets) and their slots: phase 1
   runs the conv of every (row, channel chunk) over the row's tokens in order; phase 2 the delta rule of
   every (one-token row, value head), and of every (prefill row, value head, column tile) over its tokens
   in order (dn_tile; a prefill row spreads over the threads); phase 3 the gated norm of the prefill
   rows' tokens. mixed holds phase 1's outputs of tokens [t0, t1), o_rows the prefill rows' o. */
static void LC_FN(deltanet_block)(const void *y, int64_t y_stride, int bf16, int64_t rows, const int64_t *starts,
                                  const int64_t *slots, int64_t t0, int64_t t1, void *conv_state, int win_bf16,
                                  int64_t channels, int64_t width, const float *conv_w, float *rec_state, int64_t nk,
                                  int64_t nv, int64_t dk, int64_t dv, const float *neg_a, const float *dt_bias,
                                  const float *norm_w, float eps, void *out, float *mixed, float *o_rows,
                                  const int64_t *keep, int nth) {
    const size_t es = bf16 ? 2 : 4, ws = win_bf16 ? 2 : 4;
    const int64_t chunk = LC_DN_CONV_CH, pieces = (channels + chunk - 1) / chunk, group = nv / nk;
    const int64_t tiles = dv % LC_DN_TILE ? 0 : dv / LC_DN_TILE; /* 0: prefill rows take dn_head too */
    const int64_t yb = (channels + nv * dv) * (int64_t)es;       /* bytes to a token's b | a */
    (void)nth;
#pragma omp parallel num_threads(nth) if ((t1 - t0) * nv > 1)
    {
#pragma omp for schedule(static)
        for (int64_t p = 0; p < rows * pieces; p++) {
            const int64_t r = p / pieces, c0 = (p % pieces) * chunk;
            const int64_t c1 = c0 + chunk < channels ? c0 + chunk : channels;
            const int64_t a0 = starts[r] > t0 ? starts[r] : t0, a1 = starts[r + 1] < t1 ? starts[r + 1] : t1;
            void *win = (char *)conv_state + (size_t)(slots[r] * channels * width) * ws;
            /* a verify row (keep: its states per position) takes the decode numerics, token by token */
            const int one = starts[r + 1] - starts[r] == 1 || (keep && keep[starts[r]] >= 0);
            if (width <= LC_DN_MAX_WIDTH) {
                if (a0 < a1)
                    LC_FN(dn_conv_block)((const char *)y + (size_t)(a0 * y_stride) * es, (size_t)y_stride * es, bf16, win,
                                         win_bf16, width, conv_w, c0, c1 - c0, a0, a1, one,
                                         mixed + (a0 - t0) * channels, channels, (char *)conv_state, keep);
                continue;
            }
            for (int64_t t = a0; t < a1; t++)
                LC_FN(dn_conv)((const char *)y + (size_t)(t * y_stride) * es, bf16, win, win_bf16, width, conv_w, c0,
                               c1, one, mixed + (t - t0) * channels,
                               keep && keep[t] >= 0 ? (char *)conv_state + (size_t)(keep[t] * channels * width) * ws
                                                    : NULL);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t p = 0; p < rows * nv * (tiles ? tiles : 1); p++) {
            const int64_t per = nv * (tiles ? tiles : 1), r = p / per, h = p % per / (tiles ? tiles : 1);
            const int64_t kh = h / group, a0 = starts[r] > t0 ? starts[r] : t0;
            const int64_t a1 = starts[r + 1] < t1 ? starts[r + 1] : t1;
            if (a0 >= a1) continue;
            float *s = rec_state + ((slots[r] * nv + h) * dk) * dv;
            const char *y0 = (const char *)y + (size_t)(a0 * y_stride) * es;
            const int verify = keep && keep[starts[r]] >= 0;
            if (tiles && starts[r + 1] - starts[r] > 1 && !verify) {
                LC_FN(dn_tile)(mixed + (a0 - t0) * channels, channels, y0, (size_t)y_stride * es, yb, bf16, a0, a1, nk,
                               nv, dk, dv, h, kh, p % tiles * LC_DN_TILE, neg_a, dt_bias, s,
                               o_rows + (a0 - t0) * nv * dv, nv * dv);
                continue;
            }
            if (tiles && p % tiles) continue; /* one-token and verify rows: the first tile's task runs the head */
            float qn[512], kn[512], delta[512], o[512]; /* dk, dv <= 512 (checked by the export) */
            for (int64_t t = a0; t < a1; t++) {
                const float *m = mixed + (t - t0) * channels;
                const char *yr = (const char *)y + (size_t)(t * y_stride) * es;
                float decay, beta;
                LC_FN(dn_token)(m, yr + yb, bf16, nk, nv, dk, h, kh, neg_a, dt_bias, qn, kn, &decay, &beta);
                LC_FN(dn_head)(qn, kn, m + 2 * nk * dk + h * dv, decay, beta, s, dk, dv, delta, o);
                LC_FN(dn_gate)(o, dv, norm_w, eps, yr + (size_t)(channels + h * dv) * es, bf16,
                               (char *)out + (size_t)((t * nv + h) * dv) * es);
                if (keep && keep[t] >= 0) /* the head's state after this token, into the spec row */
                    memcpy(rec_state + ((keep[t] * nv + h) * dk) * dv, s, (size_t)(dk * dv) * 4);
            }
        }
        if (tiles) {
#pragma omp for schedule(static)
            for (int64_t p = 0; p < (t1 - t0) * nv; p++) {
                const int64_t t = t0 + p / nv, h = p % nv;
                int64_t r = 0;
                while (starts[r + 1] <= t) r++;
                if (starts[r + 1] - starts[r] == 1 || (keep && keep[starts[r]] >= 0)) continue; /* gated in phase 2 */
                const char *yr = (const char *)y + (size_t)(t * y_stride) * es;
                LC_FN(dn_gate)(o_rows + (t - t0) * nv * dv + h * dv, dv, norm_w, eps,
                               yr + (size_t)(channels + h * dv) * es, bf16,
                               (char *)out + (size_t)((t * nv + h) * dv) * es);
            }
        }
    }
}

#else /* included once more after the ISA variants and LC_DISPATCH: the export */
/* Per-thread conv outputs and prefill o of lc_deltanet_step (the caller's thread), grown by lc_grow. */
LC_SCRATCH(lc_dn);
#define LC_DN_BLOCK 128 /* tokens per pass: bounds the scratch (128 x (channels + nv dv) floats) */

/* Gated DeltaNet over one step's tokens (above): rows of starts[r] .. starts[r + 1] (token offsets into y,
   starts[0] = 0, increasing; one token for a decode row, more for a prefill row), each continuing the
   state in slots[r]. y [tokens, y_stride] in the compute type (bfloat16 if bf16, else float32) holds per
   token q|k|v [channels], z [nv * dv], b [nv], a [nv]; conv_state [num_slots, channels, width] (bfloat16
   if win_bf16) and rec_state [num_slots, nv, dk, dv] float32 are updated in place; conv_w [channels,
   width + 1], neg_a = -exp(A_log) [nv], dt_bias [nv], norm_w [dv], all float32. out [tokens, nv * dv]
   in the compute type: RMSNorm(o) * silu(z) per head. */
/* lc_deltanet_step_keep: the same, and keep (int64 [tokens], or NULL) names per token a spec row that also
   receives the state and conv window after that token (-1: none), in a speculative verify row (the last
   token and the drafts: engine/hybrid_spec.py). Such a row runs token by token with the decode numerics
   (the conv's rounded products, the per-head pass of a one-token row); a spec row is none of the step's
   slots. */
LC_EXPORT int lc_deltanet_step_keep(int isa, const void *y, int64_t y_stride, int bf16, int64_t rows,
                                    const int64_t *starts, const int64_t *slots, void *conv_state, int win_bf16,
                                    int64_t num_slots, int64_t channels, int64_t width, const float *conv_w,
                                    float *rec_state, int64_t nk, int64_t nv, int64_t dk, int64_t dv, const float *neg_a,
                                    const float *dt_bias, const float *norm_w, float eps, void *out,
                                    const int64_t *keep, int nth) {
    if (!lc_isa_supported(isa) || rows < 0 || nk < 1 || nv < nk || nv % nk || dk < 1 || dk > 512 || dv < 1 ||
        dv > 512 || width < 0 || channels != 2 * nk * dk + nv * dv || y_stride < channels + nv * dv + 2 * nv ||
        nth < 1 || starts[0] != 0)
        return -1;
    for (int64_t r = 0; r < rows; r++) {
        if (slots[r] < 0 || slots[r] >= num_slots || starts[r + 1] <= starts[r]) return -1;
        for (int64_t t = starts[r]; keep && t < starts[r + 1]; t++)
            if (keep[t] >= num_slots || keep[t] == slots[r]) return -1;
    }
    const int64_t tokens = starts[rows];
    float *mixed = (float *)lc_grow(&lc_dn, &lc_dn_size, (size_t)(LC_DN_BLOCK * (channels + nv * dv)) * 4 + 64);
    if (!mixed) return LC_ENOMEM;
    float *o_rows = mixed + LC_DN_BLOCK * channels;
    for (int64_t t0 = 0; t0 < tokens; t0 += LC_DN_BLOCK) {
        const int64_t t1 = t0 + LC_DN_BLOCK < tokens ? t0 + LC_DN_BLOCK : tokens;
        LC_DISPATCH(deltanet_block, y, y_stride, bf16, rows, starts, slots, t0, t1, conv_state, win_bf16, channels,
                    width, conv_w, rec_state, nk, nv, dk, dv, neg_a, dt_bias, norm_w, eps, out, mixed, o_rows, keep,
                    nth);
    }
    return 0;
}

LC_EXPORT int lc_deltanet_step(int isa, const void *y, int64_t y_stride, int bf16, int64_t rows, const int64_t *starts,
                               const int64_t *slots, void *conv_state, int win_bf16, int64_t num_slots, int64_t channels,
                               int64_t width, const float *conv_w, float *rec_state, int64_t nk, int64_t nv, int64_t dk,
                               int64_t dv, const float *neg_a, const float *dt_bias, const float *norm_w, float eps,
                               void *out, int nth) {
    return lc_deltanet_step_keep(isa, y, y_stride, bf16, rows, starts, slots, conv_state, win_bf16, num_slots,
                                 channels, width, conv_w, rec_state, nk, nv, dk, dv, neg_a, dt_bias, norm_w, eps, out,
                                 NULL, nth);
}
#endif
