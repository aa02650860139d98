//! Provider protocols: classify decoded frames into progress, terminal proof, provider errors and resume cursors.
