
#include <stdint.h>
int32_t aotrt_error = 0;

/* P[0]: the floats; P[1]: int64 {dims, inner, chunks, code, size[6], stride[6]}: rows of
   `inner` contiguous floats at the outer dims' strided offsets, each row in `chunks` work
   items of CHUNK floats. A NaN stays NaN and -0.0 stays -0.0, as in torch. */
static void items(char **P, int64_t begin, int64_t end) {
    float *x = (float *)P[0];
    const int64_t *p = (const int64_t *)P[1];
    const int64_t dims = p[0], inner = p[1], chunks = p[2], code = p[3];
    const int64_t *size = p + 4, *stride = p + 4 + MAX_DIMS;
    for (int64_t t = begin; t < end; t++) {
        int64_t row = t / chunks, lo = t % chunks * CHUNK, off = 0;
        int64_t hi = lo + CHUNK < inner ? lo + CHUNK : inner;
        for (int64_t d = dims - 1; d >= 0; d--) {
            off += row % size[d] * stride[d];
            row /= size[d];
        }
        float *v = x + off;
        if (code == 1) {
            for (int64_t i = lo; i < hi; i++) v[i] = v[i] < 0.0f ? 0.0f : v[i];
        } else {
            for (int64_t i = lo; i < hi; i++)
                v[i] = v[i] < 0.0f ? 0.0f : (v[i] > 6.0f ? 6.0f : v[i]);
        }
    }
}

void aot_activation_in_place(char **P, int64_t begin, int64_t end, int64_t threads) {
    const int64_t n = end - begin, nt = threads < n ? threads : n;
    if (nt <= 1) { items(P, begin, end); return; }
    const int64_t chunk = n / nt, rem = n % nt;
    #pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (int64_t c = 0; c < nt; c++) {
        const int64_t lo = begin + c * chunk + (c < rem ? c : rem);
        items(P, lo, lo + chunk + (c < rem ? 1 : 0));
    }
}
