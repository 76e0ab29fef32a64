"""Lifetimes of C objects that depend on one another.

A communicator must outlive its plans, an in-process world its
communicators, a host communicator the CUDA IPC communicator over it. In
Python the dependents hold their parent, so reference counting frees them
first; but the cycle collector and interpreter shutdown finalize objects
in any order, and an explicit close() of a parent may find dependents it
can no longer reach (weak references are cleared before finalizers run).
So a parent's C handle is destroyed only once it was closed AND every
dependent's handle is gone: close() closes the dependents it can reach,
and the last dependent to go destroys a closed parent. Objects without
dependents (layouts, models) use the same close / handle / context
manager.
"""
import threading
import weakref

from .errors import InvalidUsageError


class Node:
    """Mixin: ``_live(handle, destroy, parent, what)`` in __init__."""

    def _live(self, handle, destroy, parent=None, what="object"):
        """Takes ``handle``; if the parent refuses a dependent (it is
        closing), raises and takes nothing: the caller destroys handle."""
        self._h = None
        self._parent = None
        self._destroy_fn = destroy
        self._what = what
        self._closing = False
        self._deps = 0
        self._dep_refs = weakref.WeakSet()
        self._life_lock = threading.Lock()
        if parent is not None:
            parent._add_dep(self)
        self._parent = parent
        self._h = handle

    def _add_dep(self, child):
        with self._life_lock:
            if self._closing:
                raise InvalidUsageError("%s: used after close()" % self._what)
            self._deps += 1
            self._dep_refs.add(child)

    def _dep_gone(self):
        with self._life_lock:
            self._deps -= 1
        self._reap()

    def _reap(self):
        with self._life_lock:
            if not self._closing or self._deps or self._h is None:
                return
            h, self._h = self._h, None
        self._destroy_fn(h)
        parent, self._parent = self._parent, None
        if parent is not None:
            parent._dep_gone()

    @property
    def handle(self):
        """The C pointer (cffi); InvalidUsageError once closed."""
        h = getattr(self, "_h", None)
        if h is None or self._closing:
            raise InvalidUsageError("%s: used after close()" % self._what)
        return h

    @property
    def closed(self):
        return getattr(self, "_closing", True)

    def close(self):
        """Destroys the C object (after the dependents it has: closed
        first); idempotent."""
        if not hasattr(self, "_life_lock"):
            return  # __init__ failed before the handle existed
        for d in list(self._dep_refs):
            d.close()
        with self._life_lock:
            self._closing = True
        self._reap()

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
