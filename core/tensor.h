#ifndef KVSHIM_TENSOR_H
#define KVSHIM_TENSOR_H
#endif
