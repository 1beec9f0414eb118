# preload and CUDA hook tests (being written).
