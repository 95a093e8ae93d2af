# The fixed token sequence every forward pass of the device run reads: ids
# below the tiny Qwen3.5's vocabulary (512), starting with <|endoftext|>.
TOKENS = [509, 71, 72, 33, 140, 201, 256, 300, 350, 402, 448, 490, 7, 19, 88, 123]
