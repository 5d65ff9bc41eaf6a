// inq_window: the KH x KW windows a layer reads, from a stream of H x W pixels in raster order
// (one pixel of C channels, B bits each, per valid beat; beats may have gaps).
//
// A shift register holds the last (KH-1)*W + KW pixels. Output (i, j) is due when the pixel at
// raster index (i*SH - PH + KH-1)*W + j*SW - PW + KW-1 (its window's bottom-right tap) is
// shifted in; tap (u, v) is then a fixed distance back, (KH-1-u)*W + KW-1-v. Taps outside the
// frame (padding) read 0. Windows whose bottom-right tap lies past the last pixel are completed
// by FLUSH ticks after it: one a cycle, shifting in zeros, whether or not a beat arrives (the
// stream must leave FLUSH idle cycles after a frame's last beat, which the top level does).
// The window goes out one cycle after its last pixel came in, taps in (u, v, c) order, tap 0
// at the least significant bits.
module inq_window #(
    parameter H = 8, W = 8, C = 1, B = 8,
    parameter KH = 3, KW = 3, SH = 1, SW = 1, PH = 1, PW = 1,
    parameter OH = 8, OW = 8, FLUSH = 9, NB = 16
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

    reg [NB-1:0] n;        // raster index of the pixel shifted in next
    reg [NB-1:0] due;      // when the next output is due
    reg [NB-1:0] row_due;  // when the first output of its row is due
    reg signed [NB-1:0] r0, c0;  // its window's top-left input row and column
    reg [NB-1:0] oj;       // its column

    wire flushing = n >= H * W;
    wire advance = in_valid | flushing;
    wire [C*B-1:0] tap [0:L-1];
    assign tap[0] = flushing ? {C*B{1'b0}} : in_data;
    genvar d, u, v;
    generate
        if (L > 1) begin : line
            reg [C*B-1:0] shift [0:L-2];
            always @(posedge clk) if (advance) begin : step
                integer k;
                shift[0] <= tap[0];
                for (k = 1; k < L - 1; k = k + 1) shift[k] <= shift[k - 1];
            end
            for (d = 1; d < L; d = d + 1) begin : taps
                assign tap[d] = shift[d - 1];
            end
        end
    endgenerate

    wire [KH*KW*C*B-1:0] window;
    generate
        for (u = 0; u < KH; u = u + 1) begin : rows
            for (v = 0; v < KW; v = v + 1) begin : cols
                localparam D = (KH - 1 - u) * W + KW - 1 - v;
                if (PH > 0 || PW > 0) begin : padded
                    wire in_frame = (r0 + u >= 0) && (r0 + u < H) && (c0 + v >= 0) && (c0 + v < W);
                    assign window[(u*KW+v)*C*B +: C*B] = in_frame ? tap[D] : {C*B{1'b0}};
                end else begin : plain
                    assign window[(u*KW+v)*C*B +: C*B] = tap[D];
                end
            end
        end
    endgenerate

    always @(posedge clk) begin
        if (rst) begin
            n <= 0; due <= T0; row_due <= T0; r0 <= -PH; c0 <= -PW; oj <= 0; out_valid <= 0;
        end else begin
            out_valid <= advance && n == due;
            if (advance) begin
                if (n == due) begin
                    out_data <= window;
                    if (oj + 1 < OW) begin
                        oj <= oj + 1; c0 <= c0 + SW; due <= due + SW;
                    end else begin
                        oj <= 0; c0 <= -PW; r0 <= r0 + SH;
                        row_due <= row_due + SH * W; due <= row_due + SH * W;
                    end
                end
                if (n == N - 1) begin
                    n <= 0; due <= T0; row_due <= T0; r0 <= -PH; c0 <= -PW; oj <= 0;
                end else begin
                    n <= n + 1;
                end
            end
        end
    end
endmodule
