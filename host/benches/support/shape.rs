//! What a component's bytes say about its shape: the parts that cost something at each
//! instantiation (core instances, memories, tables, data and element segments).

#![allow(dead_code)] // Each benchmark prints its share.

/// Counts read from a component's bytes, nested modules included.
#[derive(Debug, Default)]
pub struct Shape {
    pub bytes: usize,
    pub core_modules: usize,
    pub core_instances: usize,
    pub memories: usize,
    /// The sum of the memories' initial sizes, in bytes.
    pub initial_memory: u64,
    pub tables: usize,
    /// The sum of the tables' initial sizes, in elements.
    pub table_elements: u64,
    /// Bytes of active data segments: copied into memory, or mapped from an image.
    pub data_bytes: u64,
    /// Element segments: each fills a table at instantiation.
    pub element_segments: usize,
    /// Core modules with a start function, which runs at instantiation.
    pub start_functions: usize,
    /// Instances and functions the component imports.
    pub imports: usize,
    /// Canonical functions other than lifts: host functions lowered into core wasm, and
    /// resource intrinsics. Each becomes a trampoline the instance links at instantiation.
    pub lowered: usize,
}

/// Reads the shape of `bytes`, a valid component.
pub fn shape(bytes: &[u8]) -> Shape {
    use wasmparser::Payload;
    let mut shape = Shape {
        bytes: bytes.len(),
        ..Shape::default()
    };
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.expect("a valid component") {
            Payload::ModuleSection { .. } => shape.core_modules += 1,
            Payload::InstanceSection(reader) => {
                for instance in reader {
                    if let wasmparser::Instance::Instantiate { .. } = instance.unwrap() {
                        shape.core_instances += 1;
                    }
                }
            }
            Payload::MemorySection(reader) => {
                for memory in reader {
                    shape.memories += 1;
                    shape.initial_memory += memory.unwrap().initial * 65536;
                }
            }
            Payload::TableSection(reader) => {
                for table in reader {
                    shape.tables += 1;
                    shape.table_elements += table.unwrap().ty.initial;
                }
            }
            Payload::DataSection(reader) => {
                for data in reader {
                    let data = data.unwrap();
                    if let wasmparser::DataKind::Active { .. } = data.kind {
                        shape.data_bytes += data.data.len() as u64;
                    }
                }
            }
            Payload::ElementSection(reader) => shape.element_segments += reader.count() as usize,
            Payload::StartSection { .. } => shape.start_functions += 1,
            Payload::ComponentImportSection(reader) => shape.imports += reader.count() as usize,
            Payload::ComponentCanonicalSection(reader) => {
                for function in reader {
                    if !matches!(
                        function.unwrap(),
                        wasmparser::CanonicalFunction::Lift { .. }
                    ) {
                        shape.lowered += 1;
                    }
                }
            }
            _ => {}
        }
    }
    shape
}
