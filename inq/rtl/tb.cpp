// inq RTL testbench: streams frames through inq_top and writes what comes out; it checks
// nothing itself (the caller compares with the integer model). tb_config.h, written by the
// export, gives the design's geometry.
//
//   sim IN OUT FRAMES SEED   IN: FRAMES x PIXELS x CHANNELS int32, OUT: FRAMES x BEATS x
//                            OUT_CHANNELS int32; SEED 0: no gaps, else seeded random input
//                            gaps and output stalls. Prints {"cycles", "latency", "interval"}.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "Vinq_top.h"
#include "tb_config.h"
#include "verilated.h"

static uint32_t words[WORDS];

static void put(int offset, int width, int64_t v) {
    for (int b = 0; b < width; b++) {
        int bit = offset + b;
        uint32_t mask = 1u << (bit % 32);
        if ((v >> b) & 1) words[bit / 32] |= mask; else words[bit / 32] &= ~mask;
    }
}

static int64_t get(int offset, int width) {
    int64_t v = 0;
    for (int b = 0; b < width; b++)
        if ((words[(offset + b) / 32] >> ((offset + b) % 32)) & 1) v |= (int64_t)1 << b;
    if ((v >> (width - 1)) & 1) v -= (int64_t)1 << width;
    return v;
}

// a port of at most 64 bits is an integer; a wider one is Verilator's VlWide of 32-bit words
template <typename T> static void to_port(T& port) {
    port = (T)((uint64_t)words[0] | ((uint64_t)words[1] << 32));
}
template <std::size_t N> static void to_port(VlWide<N>& port) {
    for (std::size_t i = 0; i < N; i++) port[i] = words[i];
}
template <typename T> static void from_port(const T& port) {
    uint64_t v = port;
    words[0] = (uint32_t)v;
    words[1] = (uint32_t)(v >> 32);
}
template <std::size_t N> static void from_port(const VlWide<N>& port) {
    for (std::size_t i = 0; i < N; i++) words[i] = port[i];
}

int main(int argc, char** argv) {
    if (argc != 5) { fprintf(stderr, "usage: sim IN OUT FRAMES SEED\n"); return 2; }
    const long frames = atol(argv[3]);
    const unsigned seed = (unsigned)atol(argv[4]);
    std::vector<int32_t> in((size_t)frames * PIXELS * CHANNELS);
    FILE* f = fopen(argv[1], "rb");
    if (!f || fread(in.data(), 4, in.size(), f) != in.size()) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 2;
    }
    fclose(f);
    std::vector<int32_t> out((size_t)frames * BEATS * OUT_CHANNELS);
    Verilated::randReset(0);
    Vinq_top* top = new Vinq_top;
    top->rst = 1; top->in_valid = 0; top->out_ready = 0;
    for (int i = 0; i < 4; i++) { top->clk = 0; top->eval(); top->clk = 1; top->eval(); }
    top->rst = 0;
    size_t sent = 0, got = 0;
    const size_t total_in = in.size() / CHANNELS, total_out = out.size() / OUT_CHANNELS;
    long cycle = 0, first_in = -1, first_out = -1;
    const long limit = 1000 + (long)frames * (4 * INTERVAL + 1000);
    unsigned state = seed;
    auto coin = [&]() {  // 3 in 4 with a seed, else always
        state = state * 1103515245u + 12345u;
        return seed == 0 || ((state >> 16) & 3) != 0;
    };
    while (got < total_out && cycle < limit) {
        top->clk = 0;
        top->in_valid = sent < total_in && coin();
        if (top->in_valid) {
            for (int c = 0; c < CHANNELS; c++) put(c * IN_FIELD, IN_FIELD, in[sent * CHANNELS + c]);
            to_port(top->in_data);
        }
        top->out_ready = coin();
        top->eval();
        if (top->in_valid && top->in_ready) {
            if (first_in < 0) first_in = cycle;
            sent++;
        }
        if (top->out_valid && top->out_ready) {
            if (first_out < 0) first_out = cycle;
            from_port(top->out_data);
            for (int c = 0; c < OUT_CHANNELS; c++)
                out[got * OUT_CHANNELS + c] = (int32_t)get(c * OUT_FIELD, OUT_FIELD);
            got++;
        }
        top->clk = 1;
        top->eval();
        cycle++;
    }
    top->final();
    delete top;
    if (got < total_out) {
        fprintf(stderr, "timeout: %zu of %zu output beats after %ld cycles\n", got, total_out,
                cycle);
        return 1;
    }
    f = fopen(argv[2], "wb");
    if (!f || fwrite(out.data(), 4, out.size(), f) != out.size()) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 2;
    }
    fclose(f);
    printf("{\"cycles\": %ld, \"latency\": %ld, \"interval\": %d}\n", cycle, first_out - first_in,
           INTERVAL);
    return 0;
}
