// inq_window: the KH x KW windows a layer reads, from a stream of H x W pixels in raster order
// (one pixel of C channels, B bits each, per valid beat; beats may have gaps).
//
// A shift register holds the last (KH-1)*W + KW pixels. Output (i, j) is due when the pixel at
// raster index (i*SH - PH + KH-1)*W + j*SW - PW + KW-1 (its window's bottom-right tap) is
// shifted in; tap (u, v) is then a fixed distance back, (KH-1-u)*W + KW-1-v. Taps outside the
// frame (padding) read 0. Windows whose bottom-right tap lies past the last pixel are completed
// by FLUSH ticks after it: one a cycle, shifting in zeros, whether or not a beat arrives (the
// stream must leave FLUSH idle cycles after a frame's last beat, which the top level does).
// A beat is registered on the way in, and the window goes out one cycle after that register
// shifted into the line: two cycles after its last pixel arrived. Taps in (u, v, c) order,
// tap 0 at the least significant bits.
//
// The two enables, shift (a pixel moves down the line) and capture (the window is taken), reach
// every line-buffer and window flip-flop: a wide window (a linear layer's or a global pool's,
// thousands of bits) would put their logic and routing on the critical path. So both are
// computed a cycle ahead from the next state and registered in copies, each driving at most
// FANOUT bits: each copy an inq_enable instance, a module synthesis keeps whole, so that it
// does not merge the copies back into one flip-flop.
module inq_window #(
    parameter H = 8, W = 8, C = 1, B = 8,
    parameter KH = 3, KW = 3, SH = 1, SW = 1, PH = 1, PW = 1,
    parameter OH = 8, OW = 8, FLUSH = 9, NB = 16, FANOUT = 64
) (
    input clk,
    input rst,
    input in_valid,
    input [C*B-1:0] in_data,
    output reg out_valid,
    output reg [KH*KW*C*B-1:0] out_data
);
    localparam L = (KH - 1) * W + KW;              // pixels a window spans in raster order
    localparam N = H * W + FLUSH;                   // ticks a frame takes here
    localparam T0 = (KH - 1 - PH) * W + KW - 1 - PW;  // when output (0, 0) is due
    localparam P = C * B;                           // bits of a pixel
    localparam G = FANOUT > P ? FANOUT / P : 1;     // pixels (or taps) an enable copy drives
    localparam SHIFTS = (L + G - 1) / G;            // copies of the shift enable
    localparam CAPTURES = (KH * KW + G - 1) / G;    // copies of the capture enable

    // The control keeps every sum and comparison its next state needs one cycle ahead in
    // registers (n + 1, due + SW, ...): the enables' logic is then a few LUTs of equalities
    // between registers, not adder carry chains.
    reg [NB-1:0] n, n1;             // raster index of the pixel shifted in next, and n + 1
    reg [NB-1:0] due, due_step;     // when the next output is due, and due + SW
    reg [NB-1:0] row_due, row_step; // when the first output of its row is due, and + SH * W
    wire [NB-1:0] oi1, oj1;         // its output row and column, plus 1
    reg row_end;                    // its column is OW - 1
    wire [KH-1:0] row_in;           // per window row u: inside the frame (inq_masks)
    wire [KW-1:0] col_in;           // per window column v: likewise
    reg at_last, at_end;            // n == N - 1, n == H * W - 1
    reg flushing;                   // n >= H * W
    reg [P-1:0] beat;               // the registered input pixel
    wire [SHIFTS-1:0] shift_en;     // this cycle: a pixel (or a flush tick) moves in
    wire [CAPTURES-1:0] capture_en; // ... and it completes the due window

    // the next state, from this cycle's enables
    wire advance = shift_en[0];
    wire capture = capture_en[0];   // implies advance
    wire wrap = advance && at_last;
    wire [NB-1:0] n_next = wrap ? 0 : advance ? n1 : n;
    wire [NB-1:0] due_next = wrap ? T0 : !capture ? due : row_end ? row_step : due_step;
    wire [NB-1:0] row_due_next = wrap ? T0 : capture && row_end ? row_step : row_due;
    wire next_row = capture && row_end;
    wire restart_row = wrap || next_row;  // the next output is the first of a row
    wire flushing_next = wrap ? 1'b0 : advance && at_end ? 1'b1 : flushing;
    wire advance_next = in_valid | flushing_next;
    wire due_hit = wrap ? T0 == 0                              // n_next == due_next, from
        : !advance ? n == due : !capture ? n1 == due           // comparisons of registers
        : row_end ? n1 == row_step : n1 == due_step;

    wire [P-1:0] tap [0:L-1];
    assign tap[0] = flushing ? {P{1'b0}} : beat;
    genvar d, u, v;
    generate
        for (d = 0; d < SHIFTS; d = d + 1) begin : shift_copies
            inq_enable copy (.clk(clk), .rst(rst), .d(advance_next), .q(shift_en[d]));
        end
        for (d = 0; d < CAPTURES; d = d + 1) begin : capture_copies
            inq_enable copy (.clk(clk), .rst(rst), .d(advance_next && due_hit),
                .q(capture_en[d]));
        end
    endgenerate
    generate
        for (d = 0; d < L - 1; d = d + 1) begin : line
            reg [P-1:0] stage;
            always @(posedge clk) if (shift_en[d / G]) stage <= tap[d];
            assign tap[d + 1] = stage;
        end
    endgenerate

    generate
        for (u = 0; u < KH; u = u + 1) begin : rows
            for (v = 0; v < KW; v = v + 1) begin : cols
                localparam D = (KH - 1 - u) * W + KW - 1 - v;
                localparam I = u * KW + v;
                wire [P-1:0] value;
                if (PH > 0 || PW > 0) begin : padded
                    assign value = row_in[u] && col_in[v] ? tap[D] : {P{1'b0}};
                end else begin : plain
                    assign value = tap[D];
                end
                always @(posedge clk) if (capture_en[I / G]) out_data[I*P +: P] <= value;
            end
        end
    endgenerate

    always @(posedge clk) begin
        beat <= in_data;
        if (rst) begin
            n <= 0; n1 <= 1; due <= T0; due_step <= T0 + SW; row_due <= T0;
            row_step <= T0 + SH * W; row_end <= OW == 1;
            at_last <= N == 1; at_end <= H * W == 1; flushing <= 0; out_valid <= 0;
        end else begin
            n <= n_next;
            n1 <= n_next + 1;
            at_last <= n_next == N - 1;
            at_end <= n_next == H * W - 1;
            due <= due_next;
            due_step <= due_next + SW;
            row_due <= row_due_next;
            row_step <= row_due_next + SH * W;
            flushing <= flushing_next;
            out_valid <= capture;
            if (restart_row) row_end <= OW == 1;
            else if (capture) row_end <= oj1 == OW - 1;
        end
    end
    inq_masks #(.N(KH), .SIZE(H), .STRIDE(SH), .PAD(PH), .NB(NB)) row_masks (
        .clk(clk), .restart(rst || wrap), .step(next_row), .index1(oi1), .in_frame(row_in));
    inq_masks #(.N(KW), .SIZE(W), .STRIDE(SW), .PAD(PW), .NB(NB)) col_masks (
        .clk(clk), .restart(rst || restart_row), .step(capture), .index1(oj1), .in_frame(col_in));
endmodule

// inq_masks: along one axis of a window (its N rows, or columns), whether each tap lies inside
// the frame (SIZE inputs, stride STRIDE, padding PAD) for the current output index i. Tap t of
// output i reads input i*STRIDE - PAD + t: inside for i in [LO, HI]. Each mask is a flip-flop,
// and so is the mask of output i + 1 (in_frame1): restart (i = 0) loads constants, step (i + 1)
// moves in_frame1 in and compares the counter index1 = i + 1 with constants for the next one, a
// cycle before it is used: no adder or carry chain between the line buffer and the window, nor
// between the enables and a mask.
module inq_masks #(
    parameter N = 3, SIZE = 8, STRIDE = 1, PAD = 1, NB = 16
) (
    input clk,
    input restart,
    input step,
    output reg [NB-1:0] index1,
    output reg [N-1:0] in_frame
);
    reg [N-1:0] in_frame1;
    always @(posedge clk)
        if (restart) index1 <= 1;
        else if (step) index1 <= index1 + 1;
    genvar t;
    generate
        for (t = 0; t < N; t = t + 1) begin : taps
            localparam integer LO = PAD - t <= 0 ? 0 : (PAD - t + STRIDE - 1) / STRIDE;
            localparam integer HI = SIZE - 1 + PAD - t < 0 ? -1 : (SIZE - 1 + PAD - t) / STRIDE;
            always @(posedge clk)
                if (restart) begin
                    in_frame[t] <= 0 >= LO && 0 <= HI;
                    in_frame1[t] <= 1 >= LO && 1 <= HI;
                end else if (step) begin
                    in_frame[t] <= in_frame1[t];
                    in_frame1[t] <= (LO <= 1 || index1 >= LO - 1) && HI >= 1 && index1 <= HI - 1;
                end
        end
    endgenerate
endmodule

// One copy of an enable: a flip-flop that synthesis keeps apart from its equal copies.
(* keep_hierarchy *)
module inq_enable (
    input clk,
    input rst,
    input d,
    output reg q
);
    always @(posedge clk) q <= rst ? 1'b0 : d;
endmodule
