/* wdelta's optional compiled kernels (loaded by wdelta/codec/native.py through ctypes).
 *
 * Each function is an exact, fused equivalent of a few NumPy passes of the reference
 * codec: same results, one pass, no temporaries.  They never parse delta bytes: every
 * buffer and length they receive was allocated or validated by the Python side
 * (positions strictly increasing and below the chunk size, buffers of the stated
 * lengths).  Plain C with no Python API, so one build serves every Python version, and
 * ctypes releases the GIL around each call: the encoder's and decoder's threads run
 * these kernels in parallel.
 */
#include <stdint.h>
#include <string.h>

/* Stored words of 1, 2, 4 or 8 bytes, little-endian as in the files. */
#define FOR_SIZES(X) X(1, uint8_t) X(2, uint16_t) X(4, uint32_t) X(8, uint64_t)

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The top bit of every size-byte lane of x that is not zero, the other bits clear. */
static inline uint64_t nonzero_lanes(uint64_t x, uint64_t high) {
    uint64_t low = ~high;
    return (((x & low) + low) | x) & high;
}

/* The lane bits of nonzero_lanes gathered into the low 8 / size bits (bit j: lane j).
 * The multipliers move each lane's top bit to its own bit of the high byte or nibble;
 * no two partial products share a bit, so nothing carries into the result. */
static inline uint64_t lane_bits(uint64_t lanes, int size) {
    switch (size) {
    case 1: return ((lanes >> 7) * 0x0102040810204080ULL) >> 56;
    case 2: return (((lanes >> 15) * 0x0001000200040008ULL) >> 48) & 0xF;
    case 4: return ((lanes >> 31) & 1) | (lanes >> 62);
    default: return lanes >> 63;
    }
}

/* Outputs of the change pass have room for cap + CHANGES_SLACK entries: the vector
 * path stores whole registers (up to 64 lanes) past the last entry it keeps. */
#define CHANGES_SLACK 64

/* The portable pass over elements from..m of a chunk: appends to the n entries found
 * so far the positions where the size-byte elements of base and target differ, in
 * increasing order, and at each the words of both transforms, t ^ b and zigzag(t - b),
 * and (where dst is not NULL) t into dst; returns the new count, or -1 - n as soon as
 * more than cap differ (the n entries before that kept, dst written at them).
 * 64 bytes are compared at a time and skipped when equal; in a block that differs, the
 * differing lanes become one bit mask whose set bits are visited in order, so the only
 * unpredictable branch is that loop's exit. */
#define CHANGES(S, T, HIGH)                                                             \
    static int64_t changes##S(const T *b, const T *t, int64_t from, int64_t m, int64_t cap, \
                              int64_t *pos, T *xr, T *sb, T *dst, int64_t n) {          \
        int64_t i = from;                                                               \
        const int per = 8 / S, block = 64 / S;                                          \
        for (; i + block <= m; i += block) {                                            \
            uint64_t x[8], any = 0, mask = 0;                                           \
            for (int w = 0; w < 8; w++) {                                               \
                x[w] = load64((const uint8_t *)(b + i) + 8 * w) ^                       \
                       load64((const uint8_t *)(t + i) + 8 * w);                        \
                any |= x[w];                                                            \
            }                                                                           \
            if (!any) continue;                                                         \
            for (int w = 0; w < 8; w++)                                                 \
                mask |= lane_bits(nonzero_lanes(x[w], HIGH), S) << (w * per);           \
            if (n + __builtin_popcountll(mask) > cap) return -1 - n;                    \
            while (mask) {                                                              \
                int64_t e = i + __builtin_ctzll(mask);                                  \
                T d = (T)(t[e] - b[e]);                                                 \
                pos[n] = e;                                                             \
                xr[n] = (T)(t[e] ^ b[e]);                                               \
                sb[n] = (T)((T)(d << 1) ^ (T)(0 - (d >> (8 * S - 1))));                 \
                if (dst) dst[e] = t[e]; /* after b[e] is read: dst may be b */          \
                n++;                                                                    \
                mask &= mask - 1;                                                       \
            }                                                                           \
        }                                                                               \
        for (; i < m; i++) {                                                            \
            if (b[i] == t[i]) continue;                                                 \
            if (n == cap) return -1 - n;                                                \
            T d = (T)(t[i] - b[i]);                                                     \
            pos[n] = i;                                                                 \
            xr[n] = (T)(t[i] ^ b[i]);                                                   \
            sb[n] = (T)((T)(d << 1) ^ (T)(0 - (d >> (8 * S - 1))));                     \
            if (dst) dst[i] = t[i];                                                     \
            n++;                                                                        \
        }                                                                               \
        return n;                                                                       \
    }
CHANGES(1, uint8_t, 0x8080808080808080ULL)
CHANGES(2, uint16_t, 0x8000800080008000ULL)
CHANGES(4, uint32_t, 0x8000000080000000ULL)
CHANGES(8, uint64_t, 0x8000000000000000ULL)

/* The AVX-512 pass needs GCC 8 or clang (their AVX-512 VBMI2 intrinsics and
 * __builtin_cpu_supports names); the build hook compiles with WD_PORTABLE_ONLY defined
 * where a compiler refuses it, and the library then has the portable passes only. */
#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 8)) && \
    !defined(WD_PORTABLE_ONLY)
#define WD_AVX512 1
#endif

#ifdef WD_AVX512
#include <immintrin.h>
/* The AVX-512 pass (F, BW and VBMI2: Ice Lake, Zen 4 and later), chosen at run time:
 * a register of lanes is compared at once, and the differing lanes' positions and words
 * are compressed into the outputs without a branch per element.  It covers the whole
 * registers of the chunk and leaves the tail to the portable pass. */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vbmi2,popcnt")))

/* Positions i + j for the set bits j of the 8-lane mask k, stored at out. */
AVX512 static inline void put_positions(int64_t *out, int64_t i, __mmask8 k) {
    __m512i at = _mm512_add_epi64(_mm512_set1_epi64(i), _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0));
    _mm512_storeu_si512(out, _mm512_maskz_compress_epi64(k, at));
}

/* Positions i + j of the c lanes j whose indices (bytes, or 16-bit words) a compress left
 * at the start of v, widened 8 at a time.  The first 8 are stored whatever c is (a
 * branch there would be mispredicted about as often as a register holds no change);
 * more than 8 in one register is rare below the bitmap density.  LOAD reads the next 8
 * indices (8 bytes, or 16 for 16-bit ones) from where v was stored. */
#define PUT_INDICES(BITS, T, LOAD)                                                      \
    AVX512 static inline void put_indices##BITS(int64_t *out, int64_t i, __m512i v, int c) { \
        __m512i at = _mm512_set1_epi64(i);                                              \
        __m512i first = _mm512_cvtepu##BITS##_epi64(_mm512_castsi512_si128(v));         \
        _mm512_storeu_si512(out, _mm512_add_epi64(at, first));                          \
        if (c <= 8) return;                                                             \
        T idx[512 / BITS];                                                              \
        _mm512_storeu_si512(idx, v);                                                    \
        for (int j = 8; j < c; j += 8) {                                                \
            __m128i eight = LOAD((const __m128i *)(idx + j));                           \
            _mm512_storeu_si512(out + j, _mm512_add_epi64(at, _mm512_cvtepu##BITS##_epi64(eight))); \
        }                                                                               \
    }
PUT_INDICES(8, uint8_t, _mm_loadl_epi64)
PUT_INDICES(16, uint16_t, _mm_loadu_si128)

/* Each size's positions of the lanes set in k: compressed lane indices for the narrow
 * lanes (one compress for the register, not one per 8 lanes), compressed positions for
 * the wide ones. */
AVX512 static inline void positions1(int64_t *out, int64_t i, __mmask64 k, int c) {
    const __m512i iota = _mm512_set_epi8(
        63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42,
        41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,
        19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    put_indices8(out, i, _mm512_maskz_compress_epi8(k, iota), c);
}
AVX512 static inline void positions2(int64_t *out, int64_t i, __mmask32 k, int c) {
    const __m512i iota = _mm512_set_epi16(
        31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10,
        9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    put_indices16(out, i, _mm512_maskz_compress_epi16(k, iota), c);
}
AVX512 static inline void positions4(int64_t *out, int64_t i, __mmask16 k, int c) {
    (void)c;
    put_positions(out, i, (__mmask8)k);
    put_positions(out + __builtin_popcount(k & 0xFF), i + 8, (__mmask8)(k >> 8));
}
AVX512 static inline void positions8(int64_t *out, int64_t i, __mmask8 k, int c) {
    (void)c;
    put_positions(out, i, k);
}

/* zigzag(d) = (d << 1) ^ (d >> (bits - 1)), the shift arithmetic; there is no 8-bit
 * shift, so for bytes the sign lanes come from a mask. */
AVX512 static inline __m512i zigzag8(__m512i d) {
    return _mm512_xor_si512(_mm512_add_epi8(d, d), _mm512_movm_epi8(_mm512_movepi8_mask(d)));
}
AVX512 static inline __m512i zigzag16(__m512i d) {
    return _mm512_xor_si512(_mm512_slli_epi16(d, 1), _mm512_srai_epi16(d, 15));
}
AVX512 static inline __m512i zigzag32(__m512i d) {
    return _mm512_xor_si512(_mm512_slli_epi32(d, 1), _mm512_srai_epi32(d, 31));
}
AVX512 static inline __m512i zigzag64(__m512i d) {
    return _mm512_xor_si512(_mm512_slli_epi64(d, 1), _mm512_srai_epi64(d, 63));
}

/* The differing lanes of one register pair, compressed to the outputs at n; returns the
 * new n.  Branch-free: a register without changes stores nothing that is kept. */
#define PUT_AVX512(S, T, BITS, MASK, POPCNT)                                            \
    AVX512 static inline int64_t put##S##_avx512(__m512i vb, __m512i vt, MASK k, int64_t i, \
                                                 int64_t n, int64_t *pos, T *xr, T *sb, \
                                                 T *dst) {                              \
        __m512i z = zigzag##BITS(_mm512_sub_epi##BITS(vt, vb));                         \
        if (dst) _mm512_mask_storeu_epi##BITS(dst + i, k, vt);                          \
        __m512i x = _mm512_xor_si512(vb, vt);                                           \
        _mm512_storeu_si512(xr + n, _mm512_maskz_compress_epi##BITS(k, x));             \
        _mm512_storeu_si512(sb + n, _mm512_maskz_compress_epi##BITS(k, z));             \
        int c = POPCNT(k);                                                              \
        positions##S(pos + n, i, k, c);                                                 \
        return n + c;                                                                   \
    }

/* Registers are taken GROUP at a time and a group without changes is skipped: sparse
 * changes cost one well-predicted branch per group, while at a few percent, where most
 * registers hold a change, nearly every group takes the branch-free path (a branch per
 * register mispredicted about every other one: 1.27 ms against 0.80 ms for a
 * 4M-element bf16 chunk at 3%).  The loop stops before the tail, at *at. */
#define GROUP 4
#define CHANGES_AVX512(S, T, BITS, MASK, POPCNT)                                        \
    PUT_AVX512(S, T, BITS, MASK, POPCNT)                                                \
    AVX512 static int64_t changes##S##_avx512(const T *b, const T *t, int64_t m,        \
                                              int64_t cap, int64_t *pos, T *xr, T *sb,   \
                                              T *dst, int64_t *at) {                    \
        const int lanes = 64 / S;                                                       \
        int64_t n = 0, i = 0;                                                           \
        for (; i + GROUP * lanes <= m; i += GROUP * lanes) {                            \
            __m512i vb[GROUP], vt[GROUP];                                               \
            MASK k[GROUP], any = 0;                                                     \
            int c = 0;                                                                  \
            for (int r = 0; r < GROUP; r++) {                                           \
                vb[r] = _mm512_loadu_si512(b + i + r * lanes);                          \
                vt[r] = _mm512_loadu_si512(t + i + r * lanes);                          \
                k[r] = _mm512_cmpneq_epi##BITS##_mask(vb[r], vt[r]);                    \
                any |= k[r];                                                            \
                c += POPCNT(k[r]);                                                      \
            }                                                                           \
            if (!any) continue;                                                         \
            if (n + c > cap) return -1 - n;                                             \
            for (int r = 0; r < GROUP; r++)                                             \
                n = put##S##_avx512(vb[r], vt[r], k[r], i + r * lanes, n, pos, xr, sb, dst); \
        }                                                                               \
        *at = i;                                                                        \
        return n;                                                                       \
    }
CHANGES_AVX512(1, uint8_t, 8, __mmask64, __builtin_popcountll)
CHANGES_AVX512(2, uint16_t, 16, __mmask32, __builtin_popcount)
CHANGES_AVX512(4, uint32_t, 32, __mmask16, __builtin_popcount)
CHANGES_AVX512(8, uint64_t, 64, __mmask8, __builtin_popcount)

static int has_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vbmi2");
}
#else
static int has_avx512(void) { return 0; }
#endif

/* Which change pass wd_find_changes takes when simd is asked for: 1 the AVX-512 one,
 * 0 the portable one (no such CPU, or built without it: not x86-64, WD_PORTABLE_ONLY). */
int wd_simd(void) { return has_avx512(); }

int64_t wd_apply(void *source, int64_t m, const int64_t *pos, int64_t n, const void *values,
                 int size, int sub, int reverse);

/* The change pass over a chunk of m size-byte elements (see CHANGES): the AVX-512 one
 * where simd is set and the CPU has it, else the portable one; the same results.  The
 * outputs have room for cap + CHANGES_SLACK entries.  Where dst is not NULL (the base's
 * own words, or a copy of them) the target's differing words are stored into it as they
 * are found, while in the cache, so dst ends equal to the target; a pass that gives up
 * (-1: more than cap differ) restores the words it stored, t ^ (t ^ b). */
int64_t wd_find_changes(const void *base, const void *target, int64_t m, int64_t cap, int size,
                        int64_t *pos, void *xr, void *sb, void *dst, int simd) {
    int64_t from = 0, n = 0;
#ifdef WD_AVX512
#define VECTOR(S, T)                                                                    \
    if (size == S)                                                                      \
        n = changes##S##_avx512((const T *)base, (const T *)target, m, cap, pos, (T *)xr, \
                                (T *)sb, (T *)dst, &from);
    if (simd && has_avx512()) {
        FOR_SIZES(VECTOR)
    }
#undef VECTOR
#else
    (void)simd;
#endif
#define CASE(S, T)                                                                      \
    if (size == S && n >= 0)                                                            \
        n = changes##S((const T *)base, (const T *)target, from, m, cap, pos, (T *)xr,  \
                       (T *)sb, (T *)dst, n);
    FOR_SIZES(CASE)
#undef CASE
    if (n >= 0) return n;
    if (dst) wd_apply(dst, m, pos, -1 - n, xr, size, 0, 0);
    return -1;
}

/* source[pos[i]] = source[pos[i]] ^ v, + unzigzag(v) (forwards) or - unzigzag(v)
 * (reverse), for the n words v of values.  Positions are strictly increasing and below
 * m (checked by the caller); returns the index of the first one that is not, else -1. */
#define APPLY(S, T)                                                                     \
    static int64_t apply##S(T *src, int64_t m, const int64_t *pos, int64_t n, const T *v, \
                            int sub, int reverse) {                                     \
        for (int64_t i = 0; i < n; i++) {                                               \
            int64_t p = pos[i];                                                         \
            if (p < 0 || p >= m) return i;                                              \
            T w = v[i];                                                                 \
            if (!sub) {                                                                 \
                src[p] ^= w;                                                            \
                continue;                                                               \
            }                                                                           \
            T d = (T)((T)(w >> 1) ^ (T)(0 - (w & 1)));                                  \
            src[p] = reverse ? (T)(src[p] - d) : (T)(src[p] + d);                       \
        }                                                                               \
        return -1;                                                                      \
    }
FOR_SIZES(APPLY)

int64_t wd_apply(void *source, int64_t m, const int64_t *pos, int64_t n, const void *values,
                 int size, int sub, int reverse) {
#define CASE(S, T) \
    if (size == S) return apply##S((T *)source, m, pos, n, (const T *)values, sub, reverse);
    FOR_SIZES(CASE)
#undef CASE
    return 0;
}

/* The decoder's Rice streams (§7.6.3).  The payload's structure (lengths, counts, the
 * last unary byte, the quotients' bound, padding bits) is validated in Python; these two
 * only turn bits of buffers of known length into numbers. */

/* The stream indices (LSB first) of the set bits of the n bytes, in increasing order:
 * the first cap of them into out (out may be NULL with cap 0); returns how many there
 * are, so a caller can count first and then fill exactly. */
int64_t wd_set_bits(const uint8_t *bytes, int64_t n, int64_t *out, int64_t cap) {
    int64_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = load64(bytes + i);
        if (c + __builtin_popcountll(w) > cap) {
            c += __builtin_popcountll(w);
            continue;
        }
        while (w) {
            out[c++] = 8 * i + __builtin_ctzll(w);
            w &= w - 1;
        }
    }
    for (; i < n; i++)
        for (int b = 0; b < 8; b++)
            if (bytes[i] >> b & 1) {
                if (c < cap) out[c] = 8 * i + b;
                c++;
            }
    return c;
}

/* Positions from Rice codes: p_i = ((ones[i] - i) << k) + (r_0 + ... + r_i) + i, where
 * ones are the unary stream's 1-bit indices and r the count k-bit fields (k 0..31) of
 * the remainder stream rem, LSB first, of exactly ceil(count * k / 8) bytes.  The
 * caller checked that length and that the quotients stay within the chunk, which keeps
 * every sum below 2^58 (chunks hold at most 2^26 elements).  Each field is read with
 * one 8-byte load at its bit offset while 8 bytes remain; the last ones byte by byte. */
void wd_rice_decode(const int64_t *ones, int64_t count, const uint8_t *rem, int k,
                       int64_t *out) {
    uint64_t sum = 0, mask = k ? (1ULL << k) - 1 : 0;
    int64_t nbytes = (count * k + 7) / 8, i = 0;
    for (; i < count && (i * k >> 3) + 8 <= nbytes; i++) {
        uint64_t bit = (uint64_t)(i * k);
        sum += (load64(rem + (bit >> 3)) >> (bit & 7)) & mask;
        out[i] = (int64_t)(((uint64_t)(ones[i] - i) << k) + sum + (uint64_t)i);
    }
    for (; i < count; i++) {
        uint64_t bit = (uint64_t)(i * k), field = 0;
        for (int j = 0; j < k; j++, bit++) field |= (uint64_t)(rem[bit >> 3] >> (bit & 7) & 1) << j;
        sum += field;
        out[i] = (int64_t)(((uint64_t)(ones[i] - i) << k) + sum + (uint64_t)i);
    }
}

/* The final Rice coding of coded values (§7.6.6): the n words, widened to 64 bits, with
 * parameter k (0..63).  wd_rice_words_bits is the unary stream's length in bits, the sum
 * of (w >> k) + 1, or -1 past 2^62 (never for the k the encoder picks, whose streams are
 * smaller than the words' byte planes). */
int64_t wd_rice_words_bits(const uint64_t *w, int64_t n, int k) {
    uint64_t bits = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t q = w[i] >> k;
        if (q > (1ULL << 62) - bits) return -1;
        bits += q + 1;
    }
    return bits > (1ULL << 62) ? -1 : (int64_t)bits;
}

/* Both streams: the unary one into ubytes = ceil(bits / 8) bytes and the n k-bit
 * remainders into ceil(n * k / 8) bytes, LSB first, padding bits zero.  A field starts
 * at bit i * k and spans at most 9 bytes (k <= 63, shifted by up to 7). */
void wd_rice_words(const uint64_t *w, int64_t n, int k, uint8_t *unary, int64_t ubytes,
                   uint8_t *rem) {
    int64_t rbytes = (n * k + 7) / 8;
    uint64_t mask = k ? (~0ULL >> (64 - k)) : 0, bit = 0;
    memset(unary, 0, (size_t)ubytes);
    memset(rem, 0, (size_t)rbytes);
    for (int64_t i = 0; i < n; i++) {
        bit += w[i] >> k;
        unary[bit >> 3] |= (uint8_t)(1u << (bit & 7));
        bit++;
        if (!k) continue;
        uint64_t at = (uint64_t)i * (uint64_t)k, v = w[i] & mask;
        int shift = (int)(at & 7);
        uint64_t lo = v << shift, hi = shift ? v >> (64 - shift) : 0;
        for (int64_t j = 0, b = (int64_t)(at >> 3); j < 9 && b < rbytes; j++, b++)
            rem[b] |= (uint8_t)(j < 8 ? lo >> (8 * j) : hi);
    }
}

/* The bitmap of ceil(m / 8) bytes (nbytes) with bit pos[i] set, LSB first. */
void wd_bitmap(const int64_t *pos, int64_t n, uint8_t *out, int64_t nbytes) {
    memset(out, 0, (size_t)nbytes);
    for (int64_t i = 0; i < n; i++) out[pos[i] >> 3] |= (uint8_t)(1u << (pos[i] & 7));
}

/* counts[j * 256 + v] += how many of the n size-byte words hold byte v in plane j (byte j,
 * least significant first): the byte-plane histograms of the transform pick's estimate.
 * Four neighbouring words count into four tables: a plane's bytes are mostly one value,
 * and one table would chain each increment to the last (measured: 12 against 20 us for
 * 16K bf16 words).  The bytes are read from memory, in the files' order. */
#define PLANE_COUNTS(S, T)                                                              \
    static void plane_counts##S(const uint8_t *words, int64_t n, int64_t *counts) {     \
        uint32_t t[4][S * 256];                                                         \
        memset(t, 0, sizeof t);                                                         \
        int64_t i = 0;                                                                  \
        for (; i + 4 <= n; i += 4) {                                                    \
            uint8_t b[4 * S];                                                           \
            memcpy(b, words + i * S, 4 * S);                                            \
            for (int r = 0; r < 4; r++)                                                 \
                for (int j = 0; j < S; j++) t[r][j * 256 + b[r * S + j]]++;             \
        }                                                                               \
        for (; i < n; i++)                                                              \
            for (int j = 0; j < S; j++) t[0][j * 256 + words[i * S + j]]++;             \
        for (int v = 0; v < S * 256; v++)                                               \
            counts[v] += (int64_t)t[0][v] + t[1][v] + t[2][v] + t[3][v];                \
    }
FOR_SIZES(PLANE_COUNTS)

void wd_plane_counts(const uint8_t *words, int64_t n, int size, int64_t *counts) {
#define CASE(S, T) \
    if (size == S) plane_counts##S(words, n, counts);
    FOR_SIZES(CASE)
#undef CASE
}

/* ---- The encoder's per-chunk work after change detection ----------------------------
 * Positions' Rice streams straight from the positions (no gaps array), the split levels
 * of the coded values in one pass each, and exact histograms.  Same bytes and integers
 * as the NumPy passes they replace; the floats that steer choices stay in NumPy. */

/* out[j] = the sum of g_i >> (k0 + j) for j < nk (at most 3), over i = 0, step, 2 step,
 * ... < n (n >= 1), g_i the gaps of the increasing positions pos (g_0 = p_0, g_i =
 * p_i - p_{i-1} - 1): the Rice parameter's candidates judged in one pass, without a
 * gaps array; for step 1 or 2 also out[3 + j] = the sum over all gaps (the chosen k's
 * exact size), from the same pass, else -1.  Unsigned, as gaps are not negative: SSE2
 * shifts 64-bit lanes only so, and the loops of step 1 and 2 vectorise (step 2 as
 * pairs of one sampled and one other gap: measured 62 us for 165K gaps, against 120
 * for a strided pass and a full one). */
void wd_gap_quotients(const int64_t *pos, int64_t n, int64_t step, int k0, int nk,
                      int64_t *out) {
    int k1 = k0 + (nk > 1), k2 = k0 + 2 * (nk > 2);
    uint64_t g = (uint64_t)pos[0], s0 = g >> k0, s1 = g >> k1, s2 = g >> k2;
    uint64_t o0 = 0, o1 = 0, o2 = 0; /* the gaps outside the sample, for step 2 */
    int64_t i = step;
    if (step == 1) {
        for (; i < n; i++) {
            g = (uint64_t)(pos[i] - pos[i - 1] - 1);
            s0 += g >> k0, s1 += g >> k1, s2 += g >> k2;
        }
    } else if (step == 2) {
        for (i = 1; i + 1 < n; i += 2) {
            uint64_t go = (uint64_t)(pos[i] - pos[i - 1] - 1);
            uint64_t gs = (uint64_t)(pos[i + 1] - pos[i] - 1);
            o0 += go >> k0, o1 += go >> k1, o2 += go >> k2;
            s0 += gs >> k0, s1 += gs >> k1, s2 += gs >> k2;
        }
        if (i < n) {
            g = (uint64_t)(pos[i] - pos[i - 1] - 1);
            o0 += g >> k0, o1 += g >> k1, o2 += g >> k2;
        }
    } else if (nk == 1 && k0 == 0) { /* a sample's mean: its gaps' sum, no shifts */
        for (; i < n; i += step) s0 += (uint64_t)(pos[i] - pos[i - 1] - 1);
    } else {
        for (; i < n; i += step) {
            g = (uint64_t)(pos[i] - pos[i - 1] - 1);
            s0 += g >> k0, s1 += g >> k1, s2 += g >> k2;
        }
    }
    uint64_t sums[3] = {s0, s1, s2}, others[3] = {o0, o1, o2};
    for (int j = 0; j < nk; j++) {
        out[j] = (int64_t)sums[j];
        out[3 + j] = step <= 2 ? (int64_t)(sums[j] + others[j]) : -1;
    }
}

/* k-bit fields (1..31) written LSB first from a register, no branch on the data: after
 * each field the register's 8 bytes are stored and its whole bytes move on (8 bytes of
 * slack past the stream take the last stores).  Fewer than 8 bits stay pending. */
typedef struct {
    uint8_t *out;
    uint64_t acc;
    int filled;
} field_writer;

static inline void field_put(field_writer *f, uint64_t r, int k) {
    f->acc |= r << f->filled; /* fewer than 8 bits pending and k <= 31: they fit */
    f->filled += k;
    memcpy(f->out, &f->acc, 8);
    f->out += f->filled >> 3;
    f->acc >>= 8 * (f->filled >> 3);
    f->filled &= 7;
}

static inline void field_end(field_writer *f) {
    if (f->filled) *f->out = (uint8_t)f->acc;
}

/* Both Rice streams of the gaps of the n (>= 1) increasing positions with parameter k
 * (0..31), one after the other in out: the unary stream of ubytes (known from
 * wd_gap_quotients), then the remainder stream of ceil(n * k / 8) bytes, then 8 bytes
 * of slack for its writers.  Returns 0, or -1 (out partly written) if the codes do not
 * end in the unary stream's last byte: positions that are not increasing, or a wrong
 * ubytes, never write past it.  In one pass: for k <= 8 eight remainders fill exactly k
 * bytes, packed in a register and stored apart, with no chain from one group to the
 * next (measured 135 against 180 us for 122K codes with a second pass for them). */
int wd_rice_positions(const int64_t *pos, int64_t n, int k, uint8_t *out, int64_t ubytes) {
    memset(out, 0, (size_t)ubytes);
    uint8_t *rem = out + ubytes;
    uint64_t bit = 0, end = 8 * (uint64_t)ubytes, fmask = k ? (1ULL << k) - 1 : 0;
    int64_t i = 0, prev = -1;
    if (k <= 8)
        for (; i + 8 <= n; i += 8, rem += k) {
            uint64_t group = 0;
            for (int j = 0; j < 8; j++) {
                uint64_t g = (uint64_t)(pos[i + j] - prev - 1);
                prev = pos[i + j];
                group |= (g & fmask) << (j * k);
                bit += g >> k;
                if (bit >= end) return -1;
                out[bit >> 3] |= (uint8_t)(1u << (bit & 7));
                bit++;
            }
            if (k) memcpy(rem, &group, 8);
        }
    field_writer f = {rem, 0, 0};
    for (; i < n; prev = pos[i++]) {
        uint64_t g = (uint64_t)(pos[i] - prev - 1);
        bit += g >> k;
        if (bit >= end) return -1;
        out[bit >> 3] |= (uint8_t)(1u << (bit & 7));
        bit++;
        if (k) field_put(&f, g & fmask, k);
    }
    field_end(&f);
    return bit > end - 8 ? 0 : -1;
}

/* One split level: the n words of rest that are not split, in order, into kept, and the
 * mask of them (bit i set where rest[i] != split, LSB first) into mask, which has room
 * for ceil(n / 64) 8-byte words (the padding is zeroed); returns how many are kept, and
 * the length of the mask up to the byte of its last 1 bit into *ubytes: the level's
 * unary stream for k = 0 (for any other k its set bits are coded as positions).
 * Branch-free, as levels keep about half; words i on (a multiple of 8), c of them kept
 * before. */
#define SPLIT_MASK(S, T)                                                                \
    static int64_t split_mask##S(const T *rest, int64_t n, T split, T *kept,            \
                                 uint8_t *mask, int64_t i, int64_t c) {                 \
        for (; i + 8 <= n; i += 8) {                                                    \
            unsigned byte = 0;                                                          \
            for (int j = 0; j < 8; j++) {                                               \
                T v = rest[i + j];                                                      \
                unsigned ne = v != split;                                               \
                byte |= ne << j;                                                        \
                kept[c] = v;                                                            \
                c += ne;                                                                \
            }                                                                           \
            mask[i >> 3] = (uint8_t)byte;                                               \
        }                                                                               \
        memset(mask + (i >> 3), 0, (size_t)((n + 63) / 64 * 8 - (i >> 3)));            \
        for (; i < n; i++) {                                                            \
            unsigned ne = rest[i] != split;                                             \
            mask[i >> 3] |= (uint8_t)(ne << (i & 7));                                   \
            kept[c] = rest[i];                                                          \
            c += ne;                                                                    \
        }                                                                               \
        return c;                                                                       \
    }
FOR_SIZES(SPLIT_MASK)

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
/* With SSSE3 (x86-64 CPUs since about 2008; checked at load) a level of 1- or 2-byte
 * words, the fp8 and bf16 steps, compares 16 bytes at a time and moves the kept words
 * to the front with one byte shuffle from a table: measured 22 against 96 us for 122K
 * bf16 words, whose per-word store, compare and count cost about 2 cycles in C. */
#include <tmmintrin.h>
#define SPLIT_SSSE3 1
static int have_ssse3;
static uint8_t keep_count[256];        /* how many bits of m are set */
static uint8_t keep_bytes[256][8];     /* indices of the set bits of m in order, then 0 */
static uint8_t keep_words[256][16];    /* the same for 2-byte words: bytes 2j and 2j + 1 */

__attribute__((constructor)) static void split_tables(void) {
    __builtin_cpu_init();
    have_ssse3 = __builtin_cpu_supports("ssse3");
    for (int m = 0; m < 256; m++) {
        int c = 0;
        for (int j = 0; j < 8; j++) {
            if (!(m >> j & 1)) continue;
            keep_bytes[m][c] = (uint8_t)j;
            keep_words[m][2 * c] = (uint8_t)(2 * j);
            keep_words[m][2 * c + 1] = (uint8_t)(2 * j + 1);
            c++;
        }
        keep_count[m] = (uint8_t)c;
    }
}

/* The stores write 8 or 16 bytes at the kept count, never past the words read so far:
 * no slack needed.  Returns the count; *done is where the scalar loop goes on. */
__attribute__((target("ssse3"))) static int64_t split_mask_ssse3_1(
    const uint8_t *rest, int64_t n, uint8_t split, uint8_t *kept, uint8_t *mask,
    int64_t *done) {
    __m128i s = _mm_set1_epi8((char)split);
    int64_t c = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(rest + i));
        unsigned m = ~(unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, s)), lo = m & 255,
                 hi = m >> 8 & 255;
        mask[i >> 3] = (uint8_t)lo;
        mask[(i >> 3) + 1] = (uint8_t)hi;
        __m128i order = _mm_loadl_epi64((const __m128i *)keep_bytes[lo]);
        _mm_storel_epi64((__m128i *)(kept + c), _mm_shuffle_epi8(v, order));
        c += keep_count[lo];
        order = _mm_loadl_epi64((const __m128i *)keep_bytes[hi]);
        _mm_storel_epi64((__m128i *)(kept + c), _mm_shuffle_epi8(_mm_srli_si128(v, 8), order));
        c += keep_count[hi];
    }
    *done = i;
    return c;
}

__attribute__((target("ssse3"))) static int64_t split_mask_ssse3_2(
    const uint16_t *rest, int64_t n, uint16_t split, uint16_t *kept, uint8_t *mask,
    int64_t *done) {
    __m128i s = _mm_set1_epi16((short)split);
    int64_t c = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(rest + i));
        __m128i eq = _mm_cmpeq_epi16(v, s);
        unsigned m = ~(unsigned)_mm_movemask_epi8(_mm_packs_epi16(eq, eq)) & 255;
        mask[i >> 3] = (uint8_t)m;
        __m128i order = _mm_loadu_si128((const __m128i *)keep_words[m]);
        _mm_storeu_si128((__m128i *)(kept + c), _mm_shuffle_epi8(v, order));
        c += keep_count[m];
    }
    *done = i;
    return c;
}
#endif

int64_t wd_split_mask(const void *rest, int64_t n, int size, uint64_t split, void *kept,
                      uint8_t *mask, int64_t *ubytes) {
    int64_t i = 0, c = 0;
#ifdef SPLIT_SSSE3
    if (have_ssse3 && size == 1)
        c = split_mask_ssse3_1(rest, n, (uint8_t)split, kept, mask, &i);
    if (have_ssse3 && size == 2)
        c = split_mask_ssse3_2(rest, n, (uint16_t)split, kept, mask, &i);
#endif
#define CASE(S, T) \
    if (size == S) c = split_mask##S((const T *)rest, n, (T)split, (T *)kept, mask, i, c);
    FOR_SIZES(CASE)
#undef CASE
    int64_t b = (n + 7) / 8;
    while (b && !mask[b - 1]) b--;
    *ubytes = b;
    return c;
}

/* The indices of the set bits of a mask of words 8-byte words, in increasing order,
 * into pos (room for cap); returns how many, or -1 if more than cap. */
static int64_t mask_positions(const uint8_t *mask, int64_t words, int64_t *pos, int64_t cap) {
    int64_t c = 0;
    for (int64_t w = 0; w < words; w++)
        for (uint64_t bits = load64(mask + 8 * w); bits; bits &= bits - 1) {
            if (c == cap) return -1;
            pos[c++] = 64 * w + __builtin_ctzll(bits);
        }
    return c;
}

/* A Rice-coded split level, parameter k (0..31): the indices of the count (>= 1) set
 * bits of a mask of words 8-byte words (from wd_split_mask) into pos (room for count),
 * and the Rice streams of their gaps into out (room for cap bytes) as
 * wd_rice_positions writes them.  Returns the unary stream's length, or -1 if the mask
 * does not hold count set bits or the streams would not fit. */
int64_t wd_rice_mask(const uint8_t *mask, int64_t words, int64_t count, int k, int64_t *pos,
                     uint8_t *out, int64_t cap) {
    if (count < 1 || mask_positions(mask, words, pos, count) != count) return -1;
    int64_t sums[6];
    wd_gap_quotients(pos, count, 1, k, 1, sums);
    int64_t ubytes = (sums[0] + count - 1) / 8 + 1;
    if (ubytes + (count * k + 7) / 8 + 8 > cap) return -1;
    return wd_rice_positions(pos, count, k, out, ubytes) ? -1 : ubytes;
}

/* The exact histogram of values[0], values[step], ... (n values, step >= 1) of 1- or
 * 2-byte words: the distinct words in increasing order into words and their counts into
 * counts (room for min(taken, 256^size)); returns how many distinct.  bins (4 tables of
 * 256^size) and present (a bit per word) are the caller's scratch, all zero, and left
 * so.  Neighbouring values count into the four tables in turn: most are one or two
 * words, and one table would chain each increment to the last. */
#define HISTOGRAM(S, T)                                                                 \
    static int64_t histogram##S(const T *values, int64_t n, int64_t step, uint32_t *bins, \
                                uint64_t *present, uint64_t *words, int64_t *counts) {  \
        const int64_t span = (int64_t)1 << (8 * S);                                     \
        int64_t r = 0;                                                                  \
        for (int64_t i = 0; i < n; i += step, r = (r + 1) & 3) {                        \
            T v = values[i];                                                            \
            if (!bins[r * span + v]++) present[v >> 6] |= 1ULL << (v & 63);             \
        }                                                                               \
        int64_t d = 0;                                                                  \
        for (int64_t w = 0; w < span / 64; w++) {                                       \
            for (uint64_t bits = present[w]; bits; bits &= bits - 1) {                  \
                int64_t v = 64 * w + __builtin_ctzll(bits);                             \
                words[d] = (uint64_t)v;                                                 \
                counts[d++] = (int64_t)bins[v] + bins[span + v] + bins[2 * span + v] +  \
                              bins[3 * span + v];                                       \
                for (int t = 0; t < 4; t++) bins[t * span + v] = 0;                     \
            }                                                                           \
            present[w] = 0;                                                             \
        }                                                                               \
        return d;                                                                       \
    }
HISTOGRAM(1, uint8_t)
HISTOGRAM(2, uint16_t)

int64_t wd_histogram(const void *values, int64_t n, int64_t step, int size, uint32_t *bins,
                     uint64_t *present, uint64_t *words, int64_t *counts) {
    if (size == 1)
        return histogram1((const uint8_t *)values, n, step, bins, present, words, counts);
    return histogram2((const uint16_t *)values, n, step, bins, present, words, counts);
}

/* ---- The encoder's size estimates, in fixed point -----------------------------------
 * The same integers as wdelta/policy/values.py and transform.py compute with NumPy (their
 * docstrings define each estimate): every step is an integer operation, exact in any
 * order, so both paths make the same choices.  lg(x) is log2 of an integer x >= 1 in
 * units of 2^-16 bits: the leading bit's index plus table[the next 10 bits] (the table
 * comes from wdelta/policy/fixedlog.py). */

#define LG_ONE 65536

static inline int64_t lg(uint64_t x, const int32_t *table) {
    int e = 63 - __builtin_clzll(x);
    return (int64_t)e * LG_ONE + table[((x << (63 - e)) >> 53) & 1023];
}

/* Sum over the byte planes' 256-bin histograms of the n size-byte words of h * lg(h)
 * (the transform pick's score: higher is fewer bits). */
int64_t wd_plane_score(const uint8_t *words, int64_t n, int size, const int32_t *table) {
    int64_t counts[256 * 8] = {0}, score = 0;
    wd_plane_counts(words, n, size, counts);
    for (int i = 0; i < 256 * size; i++)
        if (counts[i]) score += counts[i] * lg((uint64_t)counts[i], table);
    return score;
}

/* What values.py passes as ESTIMATE_CONSTANTS, in its order. */
typedef struct {
    int64_t table_bytes, rice_extra, level_extra, rice_max_size, never, lg_ln2, level_fraction;
} estimate_constants;

/* values.py's _plane_bytes for one suffix: the byte planes' histograms hist (256 per
 * plane) of the left values still open. */
static int64_t plane_bytes(const int64_t *hist, int size, int64_t left, const int32_t *table,
                           const estimate_constants *c) {
    int64_t summed = 0, lg_left = lg(left > 1 ? (uint64_t)left : 1, table);
    for (int p = 0; p < size; p++) {
        int64_t total = 0, distinct = 0;
        for (int b = 0; b < 256; b++) {
            int64_t h = hist[256 * p + b];
            if (h <= 0) continue;
            int64_t ratio = lg_left - lg((uint64_t)h, table);
            total += h * (ratio > LG_ONE ? ratio : LG_ONE);
            distinct++;
        }
        int64_t estimate = (total >> 3) + c->table_bytes * LG_ONE;
        if (estimate > left * LG_ONE) estimate = left * LG_ONE;
        if (distinct > 1) summed += estimate;
    }
    return (summed + LG_ONE - 1) >> 16;
}

/* values.py's _suffix_rice: rice[j] for the suffixes j = 0..levels, from the sums of
 * w >> k over the words (sum_k) and over their first j (via head). */
static void suffix_rice(const uint64_t *w, const int64_t *counts, int64_t nwords, int size,
                        int levels, const int64_t *left, const int32_t *table,
                        const estimate_constants *c, int64_t *rice) {
    int64_t total = 0, centre[9];
    for (int64_t i = 0; i < nwords; i++) total += (int64_t)w[i] * counts[i];
    int top = 8 * size - 1;
    for (int j = 0; j <= levels; j++) {
        if (j) total -= (int64_t)w[j - 1] * counts[j - 1];
        int64_t lt = lg(total > 1 ? (uint64_t)total : 1, table);
        int64_t scaled = lt - lg(left[j] > 1 ? (uint64_t)left[j] : 1, table) + c->lg_ln2;
        centre[j] = total > 0 && scaled >= LG_ONE ? scaled >> 16 : 0;
        if (centre[j] > top) centre[j] = top;
        rice[j] = c->never;
    }
    for (int k = 0; k <= top; k++) {
        int needed = 0;
        for (int j = 0; j <= levels; j++) needed |= centre[j] - 1 <= k && k <= centre[j] + 1;
        if (!needed) continue;
        int64_t quotients = 0, head[9];
        for (int64_t i = 0; i < nwords; i++) quotients += (int64_t)(w[i] >> k) * counts[i];
        for (int j = 0; j <= levels; j++) {
            if (j) quotients -= (int64_t)(w[j - 1] >> k) * counts[j - 1];
            head[j] = quotients;
        }
        for (int j = 0; j <= levels; j++) {
            if (centre[j] - 1 > k || k > centre[j] + 1) continue;
            int64_t cost = (head[j] + left[j] + 7) / 8 + (k * left[j] + 7) / 8 + c->rice_extra;
            if (left[j] > 0 && cost < rice[j]) rice[j] = cost;
        }
    }
}

/* values.py's _level_estimates of level j (1-based): n values open, kept stay open. */
static int64_t level_bytes(int64_t n, int64_t kept, int size, const estimate_constants *c) {
    int f = (int)c->level_fraction;
    int64_t best = INT64_MAX;
    for (int k = 0; k < f; k++) {
        int64_t half = ((int64_t)1 << (f - 1)) - ((int64_t)1 << (f - 1 - k));
        int64_t quotients = ((n - kept) << (f - k)) - kept * half;
        int64_t bits = (quotients > 0 ? quotients : 0) + ((kept * (k + 1)) << f);
        if (bits < best) best = bits;
    }
    return ((best + ((int64_t)1 << (f + 3)) - 1) >> (f + 3)) + size + c->level_extra;
}

/* values.py's estimates of the nwords distinct words w, ranked, of counts counts, for
 * L = 0..levels split levels (levels <= 8, levels <= nwords): plane[L], rice[L],
 * spent[L] and scanned[L]; constants as values.py's ESTIMATE_CONSTANTS. */
void wd_value_costs(const uint64_t *w, const int64_t *counts, int64_t nwords, int size,
                    int levels, const int32_t *table, const int64_t *constants, int64_t *plane,
                    int64_t *rice, int64_t *spent, int64_t *scanned) {
    estimate_constants c;
    memcpy(&c, constants, sizeof c);
    int64_t hist[256 * 8] = {0}, left[9];
    left[0] = 0;
    for (int64_t i = 0; i < nwords; i++) {
        left[0] += counts[i];
        for (int p = 0; p < size; p++) hist[256 * p + ((w[i] >> (8 * p)) & 255)] += counts[i];
    }
    spent[0] = 2;
    scanned[0] = 0;
    for (int j = 0; j <= levels; j++) {
        if (j) {
            left[j] = left[j - 1] - counts[j - 1];
            for (int p = 0; p < size; p++)
                hist[256 * p + ((w[j - 1] >> (8 * p)) & 255)] -= counts[j - 1];
            spent[j] = spent[j - 1] + level_bytes(left[j - 1], left[j], size, &c);
            scanned[j] = scanned[j - 1] + left[j - 1];
        }
        plane[j] = plane_bytes(hist, size, left[j], table, &c);
    }
    if (size <= c.rice_max_size)
        suffix_rice(w, counts, nwords, size, levels, left, table, &c, rice);
    else
        for (int j = 0; j <= levels; j++) rice[j] = c.never;
}
