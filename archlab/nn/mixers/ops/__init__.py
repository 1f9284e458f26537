"""The mixers' numerical forms, apart from the layers that hold the weights: the delta rule, SSD, the
GPU kernels' adapters and bf16 attention on the CPU as matmuls."""
