/* The codec's GPU decoder (kernel.cu) as nvcc built it, or nothing where the build had
 * no nvcc: ft__codec_fatbin_end - ft__codec_fatbin is then 0 and GPU decodes say so. */
    .section .rodata
    .balign 64
    .globl ft__codec_fatbin
    .hidden ft__codec_fatbin
ft__codec_fatbin:
    .incbin FATBIN
    .globl ft__codec_fatbin_end
    .hidden ft__codec_fatbin_end
ft__codec_fatbin_end:
    .byte 0
    .section .note.GNU-stack,"",@progbits
