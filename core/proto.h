#ifndef KVSHIM_PROTO_H
#define KVSHIM_PROTO_H
#endif
