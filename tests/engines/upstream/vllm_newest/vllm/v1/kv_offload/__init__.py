# SPDX-License-Identifier: Apache-2.0
# Package marker of the test mirror of an engine interface (tests/engines/upstream/README.md).
