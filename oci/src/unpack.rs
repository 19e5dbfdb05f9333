//! Applying one layer (a tar stream) onto a root tree, safely: see the module's functions.
