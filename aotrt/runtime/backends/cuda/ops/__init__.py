"""The cuda side of the library ops: cuBLASLt GEMMs (through nvmath-python's bindings), cuDNN
convolution and attention (through its frontend), and own CUDA kernels where no library
fits (pooling, upsampling, topk, im2col, softmax).

Every `make_*` function runs when the op is recorded: it validates what the libraries
accept, builds (and caches) plans, and returns the work, a callable that enqueues onto the
given CudaStream. Scratch memory inside a work item comes from the stream-ordered pool
and goes back to it on the same stream, so it needs no host wait and survives graph capture.

One file per op: gemm (mm/bmm/addmm/linear, and the GEMMs inside sdpa and conv), conv, sdpa,
topk, pool, upsample; common holds what they share. This package imports nothing itself, and
its modules import the cuda libraries only inside functions, so `import aotrt` needs no GPU.
"""
