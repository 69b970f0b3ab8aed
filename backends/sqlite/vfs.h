// Declarations shared by vfs.c and vfs.go.

#define YIRANGMQ_VFS_NAME "yirangmq"

// The URI parameter that marks the writer connection (vfs.go).
#define YIRANGMQ_WRITER_PARAM "yirangmq_writer"

typedef struct yirangmq_anchor yirangmq_anchor;

int yirangmq_vfs_register(void);
int yirangmq_anchor_open(const char *path, yirangmq_anchor **out);
int yirangmq_anchor_close(yirangmq_anchor *a);
