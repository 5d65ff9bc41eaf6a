// inq_fifo: DEPTH values of WIDTH bits, first in first out, with no back-pressure: the design
// sizes DEPTH so that a push never finds it full (the simulation stops if one does).
// head is the oldest value, valid while nonempty; a value pushed shows there a cycle later.
module inq_fifo #(
    parameter WIDTH = 8, DEPTH = 2, AB = 2
) (
    input clk,
    input rst,
    input push,
    input [WIDTH-1:0] in_data,
    input pop,
    output nonempty,
    output [WIDTH-1:0] head
);
    reg [WIDTH-1:0] values [0:DEPTH-1];
    reg [AB-1:0] first, next;
    reg [AB:0] count;
    assign nonempty = count != 0;
    assign head = values[first];
    always @(posedge clk) begin
        if (push) values[next] <= in_data;
        if (rst) begin
            first <= 0; next <= 0; count <= 0;
        end else begin
            if (push) next <= next == DEPTH - 1 ? 0 : next + 1;
            if (pop) first <= first == DEPTH - 1 ? 0 : first + 1;
            count <= count + push - pop;
`ifdef VERILATOR
            if (push && !pop && count == DEPTH) $fatal(1, "inq_fifo %m: pushed while full");
`endif
        end
    end
endmodule
