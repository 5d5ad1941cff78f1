/* pbcur.h - TRANSITIONAL: see server/wire.h. The old server/wire.h brought
 * shmmap.h along; server/shard.c relies on that. */
#include "shmmap.h"
#include "wire.h"
