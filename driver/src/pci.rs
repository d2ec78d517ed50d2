//! PCI discovery through sysfs.
