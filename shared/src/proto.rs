//! Code generated from `proto/` by `build.rs`, plus the encoded descriptor set for reflection.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

pub mod runner {
    pub mod v1 {
        tonic::include_proto!("arbor.runner.v1");
    }
}

pub mod approval {
    pub mod v1 {
        tonic::include_proto!("arbor.approval.v1");
    }
}

/// Every Arbor proto file (and its imports) as an encoded `FileDescriptorSet`.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("arbor_descriptor");
