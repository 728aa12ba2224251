/* Shared by the extension's files (fastensor._C). */
#ifndef FASTENSOR_EXT_H
#define FASTENSOR_EXT_H

#define CAP_CTX "fastensor.ctx"
#define CAP_FILE "fastensor.file"
#define CAP_CKPT "fastensor.ckpt"

/** safetensors' error classes: SafetensorError (an Exception), and its subclasses that are
 * also ValueError (invalid files and arguments) and KeyError (a name a checkpoint lacks):
 * `except SafetensorError` and `except ValueError` / `KeyError` both catch them. */
extern PyObject *ft_py_error, *ft_py_value_error, *ft_py_key_error;

/** Raise for a failed call: SafetensorValueError for invalid data/arguments, else
 * OSError(errno) with the library's detail and @p path (may be NULL). @return NULL. */
PyObject *raise_ft(int err, const char *path);

/** The capsule's pointer, or NULL with ValueError("<name> is closed"). */
void *cap_get(PyObject *cap, const char *name);

/** A capsule of @p ptr that keeps @p owner (the context's capsule) alive until it is freed:
 * the context must outlive what was made from it, whatever order the interpreter frees
 * objects in at exit. */
PyObject *capsule_owning(void *ptr, const char *name, PyCapsule_Destructor free_fn,
                         PyObject *owner);
/** Drop the owner reference of a capsule made by capsule_owning (at free or close). */
void capsule_release_owner(PyObject *cap);

/** Add the spill store's functions (_store.c) to the module. @return 0 or -1. */
int store_add_functions(PyObject *module);
/** Add the batch functions (_batch.c) to the module. @return 0 or -1. */
int batch_add_functions(PyObject *module);
/** Add the codec functions (_codec.c) to the module. @return 0 or -1. */
int codec_add_functions(PyObject *module);
/** Add the checkpoint functions (_checkpoint.c) to the module. @return 0 or -1. */
int checkpoint_add_functions(PyObject *module);

#endif
